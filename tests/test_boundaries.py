"""The house's boundaries, checked on the source (issue 21): what may import what, and how big a module may grow.

- The client never imports the coordinator, except the CLI commands that run one (``serve``, ``admin``,
  ``demo``).
- The coordinator imports from the client only the wire contract (``fencepost.client.v1``) and the public
  error and tracing names (``fencepost.client.errors``, ``fencepost.client.tracing``).
- No module imports another module's underscore names (``from x import _y``); a private module
  (``fencepost.client._lease``) is imported only from inside the package that holds it. Tests may import a
  private module to unit-test it, never an underscore name.
- The coordinator's folders import only downward: process > http > api > recipes > admission > etcd > telemetry.
- No code assigns to another object's underscore attribute (``handle._released = True`` outside the
  handle's own class): each piece of state has one owner.
- No hand-written module is over 500 lines (generated ``*_pb2*`` stubs excepted), Python or TypeScript (the
  TypeScript client's ``src/`` and ``test/``; its generated ``src/gen/`` excepted).
- Every package directory is in ``pyproject.toml``'s package list (a built wheel would miss it).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: Source folder -> the dotted package it is installed as (pyproject.toml's package-dir).
PACKAGES = {"client": "fencepost.client", "coordinator": "fencepost.coordinator"}
#: Folders of hand-written Python besides the packages.
OTHER_ROOTS = ("bench", "deploy", "proto", "tests")
#: Client modules that run or administer a coordinator, and so may import it.
CLIENT_MAY_IMPORT_COORDINATOR = ("fencepost.client.cli.serve", "fencepost.client.cli.admin",
                                 "fencepost.client.cli.demo")
#: What the coordinator may import from the client.
COORDINATOR_MAY_IMPORT = ("fencepost.client.v1", "fencepost.client.errors", "fencepost.client.tracing")
MAX_LINES = 500
#: The coordinator's folders, lowest first: each may import only the ones before it (and itself).
COORDINATOR_LAYERS = ("telemetry", "etcd", "admission", "recipes", "api", "http", "process")
#: Folders of hand-written TypeScript: the TypeScript client and its tests.
TS_ROOTS = ("client/typescript/src", "client/typescript/test")
#: TypeScript that is not hand-written: buf's stubs (proto/generate.py).
TS_GENERATED = REPO / "client" / "typescript" / "src" / "gen"


def _generated(path: Path) -> bool:
    return "_pb2" in path.name


def _sources(*roots: str) -> Iterator[Path]:
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            if not _generated(path) and "node_modules" not in path.parts and ".venv" not in path.parts:
                yield path


def _typescript_sources(root: str) -> Iterator[Path]:
    """The hand-written ``*.ts`` files under ``root`` (not src/gen/, node_modules/ or tsc's dist/)."""
    for path in sorted((REPO / root).rglob("*.ts")):
        parts = path.relative_to(REPO).parts
        if not path.is_relative_to(TS_GENERATED) and "node_modules" not in parts and "dist" not in parts:
            yield path


def _module_name(path: Path) -> str:
    """The dotted name of a source file: its package's for client/ and coordinator/, else its path's."""
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[0] in PACKAGES:
        parts = PACKAGES[parts[0]].split(".") + parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """(line, absolute module, names imported from it) for each import of ``path`` (relative ones resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _package_of(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            yield node.lineno, module, [alias.name for alias in node.names]


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_client_never_imports_the_coordinator() -> None:
    """Outside the CLI's serve, admin and demo, no client module imports fencepost.coordinator."""
    found = [f"{_where(p, line)} imports {module}" for p in _sources("client")
             if not any(_within(_module_name(p), m) for m in CLIENT_MAY_IMPORT_COORDINATOR)
             for line, module, names in _imports(p)
             if _within(module, "fencepost.coordinator")
             or (module == "fencepost" and "coordinator" in names)]
    assert not found, "\n".join(found)


def test_coordinator_imports_only_the_wire_contract_and_public_names() -> None:
    """The coordinator imports from the client only fencepost.client.v1, .errors and .tracing."""
    found = []
    for path in _sources("coordinator"):
        for line, module, names in _imports(path):
            # ``from fencepost.client import errors`` imports the module fencepost.client.errors.
            targets = [f"{module}.{n}" for n in names] if module in ("fencepost", "fencepost.client") else [module]
            found += [f"{_where(path, line)} imports {target}" for target in targets
                      if _within(target, "fencepost.client")
                      and not any(_within(target, allowed) for allowed in COORDINATOR_MAY_IMPORT)]
    assert not found, "\n".join(found)


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of this repository (fencepost.* or a top folder's)."""
    parts = dotted.split(".")
    for folder, package in PACKAGES.items():
        prefix = package.split(".")
        if parts[:len(prefix)] == prefix:
            parts = [folder, *parts[len(prefix):]]
            break
    path = REPO.joinpath(*parts)
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_coordinator_folders_import_only_downward() -> None:
    """process > api > recipes > admission > etcd > telemetry: no folder imports one above it."""
    found = []
    for path in _sources("coordinator"):
        parts = path.relative_to(REPO / "coordinator").parts
        if len(parts) < 2 or parts[0] not in COORDINATOR_LAYERS:
            continue
        mine = COORDINATOR_LAYERS.index(parts[0])
        for line, module, _ in _imports(path):
            if _within(module, "fencepost.coordinator") and module.count(".") >= 2:
                other = module.split(".")[2]
                if other in COORDINATOR_LAYERS and COORDINATOR_LAYERS.index(other) > mine:
                    found.append(f"{_where(path, line)}: {parts[0]} imports {module}")
    assert not found, "\n".join(found)


def _private_module(module: str) -> str | None:
    """The package holding the first private part of ``module`` (``fencepost.client`` for
    ``fencepost.client._lease.x``), or None when every part is public."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


@pytest.mark.parametrize("root", [*PACKAGES, *OTHER_ROOTS])
def test_no_module_imports_another_modules_underscore_names(root: str) -> None:
    """No ``from x import _y`` across modules, and a private module only from inside its own package
    (tests may import a private module of the product to unit-test it)."""
    found = []
    for path in _sources(root):
        importer = _module_name(path)
        for line, module, names in _imports(path):
            if module == "__future__" or not module:
                continue
            # ``from fencepost.client import _wire`` imports the private module fencepost.client._wire.
            modules = [module] + [f"{module}.{n}" for n in names if _is_module(f"{module}.{n}")]
            private = [n for n in names if n.startswith("_") and not n.startswith("__")
                       and not _is_module(f"{module}.{n}")]
            if private:
                found.append(f"{_where(path, line)}: from {module} import {', '.join(private)}")
            for imported in modules:
                holder = _private_module(imported)
                if holder is not None and root != "tests" and _within(imported, "fencepost") \
                        and not _within(importer, holder):
                    found.append(f"{_where(path, line)}: imports private module {imported} from outside {holder}")
    assert not found, "\n".join(found)


class _ForeignPrivateWrites(ast.NodeVisitor):
    """Assignments to ``x._name`` where ``x`` is not ``self`` or ``cls`` (another object's private state)."""

    def __init__(self) -> None:
        self.found: list[int] = []

    def _target(self, target: ast.expr, line: int) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element, line)
        elif isinstance(target, ast.Attribute) and target.attr.startswith("_") and not target.attr.startswith("__"):
            owner = target.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                self.found.append(line)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._target(target, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target, node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._target(node.target, node.lineno)
        self.generic_visit(node)


@pytest.mark.parametrize("root", [*PACKAGES, *OTHER_ROOTS])
def test_no_code_writes_another_objects_private_state(root: str) -> None:
    """Only an object's own methods assign its underscore attributes: one owner per piece of state."""
    found = []
    for path in _sources(root):
        visitor = _ForeignPrivateWrites()
        visitor.visit(ast.parse(path.read_text(), str(path)))
        found += [_where(path, line) for line in visitor.found]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("root", [*PACKAGES, *OTHER_ROOTS])
def test_no_hand_written_module_over_500_lines(root: str) -> None:
    """Modules stay small: split a module along its own seams before it passes 500 lines."""
    big = [f"{p.relative_to(REPO)}: {n} lines" for p in _sources(root)
           if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not big, "\n".join(big)


@pytest.mark.parametrize("root", TS_ROOTS)
def test_no_hand_written_typescript_module_over_500_lines(root: str) -> None:
    """The same rule for the TypeScript client: split a module along its own seams before it passes 500 lines."""
    sources = list(_typescript_sources(root))
    assert sources, f"no TypeScript found under {root}"
    big = [f"{p.relative_to(REPO)}: {n} lines" for p in sources
           if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not big, "\n".join(big)


def test_every_package_is_in_pyproject() -> None:
    """Each folder with an __init__.py under client/ and coordinator/ is a package pyproject.toml lists."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    present = {_module_name(init) for root in PACKAGES for init in (REPO / root).rglob("__init__.py")
               if "node_modules" not in init.parts}
    assert present - listed == set(), f"packages missing from pyproject.toml: {sorted(present - listed)}"
    assert listed - present == set(), f"pyproject.toml lists packages that do not exist: {sorted(listed - present)}"
