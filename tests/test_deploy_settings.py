"""deploy/: every FENCEPOST_* variable and every flag given to ``fencepost`` in the Dockerfile, the compose files
and the Kubernetes manifests is one that ``fencepost serve`` or the ``fencepost`` command really reads (checked
against the real parsers)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from .conftest import REPO
from .deploy_files import (
    DEPLOY,
    compose_file,
    containers,
    dockerfile_stages,
    is_fencepost,
    pod_specs,
    stage_name,
)


def _options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """option string -> dest, of every flag of ``parser``."""
    return {s: a.dest for a in parser._actions for s in a.option_strings}


def _cli_parsers() -> dict[str, argparse.ArgumentParser]:
    from fencepost.client import cli

    sub = argparse.ArgumentParser().add_subparsers()
    for module in cli.COMMANDS.values():
        module.add_parser(sub)
    return dict(sub.choices)


def _env_read(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The FENCEPOST_* variables that fencepost serve and the client commands read.

    A flag's variable counts when setting it changes the flag's default (so
    the parser really reads it); so do the serve password, the variables the
    client commands read at run time (the ``*_ENV`` constants of
    ``fencepost.client.cli.common``, such as ``ADDRESS_ENV``), and the grant
    variables that ``fencepost run`` gives its command.
    """
    from fencepost.client.cli import common, run
    from fencepost.coordinator.process import flags

    makers = {"serve": flags.build_parser, **{n: (lambda n=n: _cli_parsers()[n]) for n in _cli_parsers()}}
    read = {flags.PASSWORD_ENV, run.ENV_LOCK, run.ENV_TOKEN, run.ENV_LEASE_ID, run.ENV_TTL}
    read |= {v for k, v in vars(common).items() if k.endswith("_ENV") and str(v).startswith("FENCEPOST_")}
    assert common.ADDRESS_ENV in read
    for make in makers.values():
        for dest in set(_options(make()).values()) - {"help"}:
            name = "FENCEPOST_" + dest.upper()
            monkeypatch.setenv(name, "sentinel-from-env")
            if make().get_default(dest) == "sentinel-from-env":
                read.add(name)
            monkeypatch.delenv(name)
    return read


def _deploy_texts() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for p in sorted(DEPLOY.rglob("*"))
            if p.is_file() and p.suffix in (".yaml", ".py", "")}


def test_every_fencepost_variable_in_deploy_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each FENCEPOST_* name in deploy/ is read by fencepost serve or the CLI."""
    read = _env_read(monkeypatch)
    assert "FENCEPOST_ETCD_ENDPOINTS" in read and "FENCEPOST_LISTEN" in read
    used = {m: path for path, text in _deploy_texts().items() for m in re.findall(r"\bFENCEPOST_[A-Z_]+\b", text)}
    assert len(used) > 10
    unknown = {name: path for name, path in used.items() if name not in read}
    assert not unknown, f"variables no fencepost command reads: {unknown}"


def _fencepost_commands() -> Iterator[tuple[str, list[str]]]:
    """(where, argv after ``fencepost``) of every fencepost invocation in the Dockerfile, compose and Kubernetes."""
    for stage in dockerfile_stages():
        for c in stage:
            if c.cmd == "CMD":
                yield f"Dockerfile {stage_name(stage)} CMD", list(c.value)
            if c.cmd == "HEALTHCHECK" and list(c.value[:2]) == ["CMD", "fencepost"]:
                yield f"Dockerfile {stage_name(stage)} HEALTHCHECK", list(c.value[2:])
    for name, svc in compose_file()["services"].items():
        if "command" in svc:
            yield f"compose {name}", svc["command"]
        test = svc.get("healthcheck", {}).get("test", [])
        if test[1:2] == ["fencepost"]:
            yield f"compose {name} healthcheck", test[2:]
    for where, spec in pod_specs():
        for c in containers(spec):
            if is_fencepost(c["image"]):
                argv = c.get("command", ["fencepost"])[1:] + c.get("args", [])
                yield f"{where}/{c['name']}", argv


def test_every_fencepost_flag_in_deploy_exists() -> None:
    """Each flag given to fencepost serve, run, status or acquire in deploy/ is one its parser has."""
    from fencepost.coordinator.process import flags

    known = {"serve": set(_options(flags.build_parser())),
             **{n: set(_options(p)) for n, p in _cli_parsers().items()}}
    seen = set()
    for where, argv in _fencepost_commands():
        assert argv and argv[0] in known, f"{where}: {argv}"
        own = argv[1:argv.index("--")] if "--" in argv else argv[1:]
        for flag in (a.split("=")[0] for a in own if a.startswith("--")):
            assert flag in known[argv[0]], f"{where}: fencepost {argv[0]} has no flag {flag}"
            seen.add(argv[0])
    assert {"run", "status"} <= seen
