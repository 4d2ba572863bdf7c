"""The committed generated stubs match proto/, and the client's public names are declared."""

from __future__ import annotations

import __future__
import subprocess
import sys
import types

import fencepost.client

from .conftest import REPO

EXPECTED_PUBLIC = {
    "LockClient",
    "AsyncLockClient",
    "LockHandle",
    "AsyncLockHandle",
    "FencepostError",
    "InvalidArgument",
    "LockHeld",
    "LockTimeout",
    "LeaseLost",
    "NotHolder",
    "StaleTokenError",
    "MissingRecordError",
    "Unavailable",
    "ResourceExhausted",
    "TlsConfig",
    "TlsError",
    "DEFAULT_ADDRESS",
}


def test_generated_stubs_are_fresh() -> None:
    """`python proto/generate.py --python --check` finds client/v1 up to date."""
    result = subprocess.run(
        [sys.executable, "proto/generate.py", "--python", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_client_all_matches_its_public_names() -> None:
    """fencepost.client.__all__ lists exactly the public names the package exports."""
    module = fencepost.client
    declared = list(module.__all__)
    assert len(declared) == len(set(declared)), "duplicates in __all__"
    for name in declared:
        assert hasattr(module, name), f"__all__ names {name!r}, which the module lacks"
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and not isinstance(value, __future__._Feature)
    }
    assert public == set(declared), {
        "exported but not in __all__": sorted(public - set(declared)),
        "in __all__ but not exported": sorted(set(declared) - public),
    }
    assert EXPECTED_PUBLIC <= set(declared), sorted(EXPECTED_PUBLIC - set(declared))


def test_errors_share_one_base_class() -> None:
    """Every client exception derives from FencepostError."""
    from fencepost.client import (
        FencepostError,
        InvalidArgument,
        LeaseLost,
        LockHeld,
        LockTimeout,
        MissingRecordError,
        NotHolder,
        ResourceExhausted,
        StaleTokenError,
        Unavailable,
    )

    for exc in (InvalidArgument, LeaseLost, LockHeld, LockTimeout, MissingRecordError, NotHolder, ResourceExhausted,
                StaleTokenError, Unavailable):
        assert issubclass(exc, FencepostError), exc
    assert issubclass(FencepostError, Exception)


def test_no_top_level_client_or_coordinator_module_installed() -> None:
    """The package installs as fencepost.client / fencepost.coordinator, not as top-level modules."""
    code = (
        "import importlib.util, sys; "
        "sys.path = [p for p in sys.path if p not in ('', '.')]; "
        "print(importlib.util.find_spec('client'), importlib.util.find_spec('coordinator'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "None None", result.stdout
