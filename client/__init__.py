"""Fencepost client: lock clients, lease handles and the fencepost command line.

A TTL lock is not mutual exclusion: pass ``handle.token`` (the fencing token)
to the storage with every write, and let it reject writes that carry a token
lower than one it has accepted. See :class:`AsyncLockClient`.

``__version__`` is the installed distribution's version (``"0.1.0"``), read with
:mod:`importlib.metadata` from the one place it is written, pyproject.toml; ``"unknown"``
when the package runs without being installed. ``fencepost`` is a namespace package
(``fencepost.client`` and ``fencepost.coordinator`` come from separate folders), so the
version lives here, as ``google.cloud.storage.__version__`` does.
"""

import importlib.metadata

from ._aio.client import AsyncLockClient
from ._info import EtcdInfo, HeldLock, LockInfo, Revoked, ServerInfo, Session
from ._recipes.election import LeaderInfo, Leadership
from ._recipes.multilock import AsyncMultiLockHandle
from ._recipes.semaphore import AsyncSemaphore, PermitHolder, SemaphoreInfo
from ._sync.client import LockClient, Semaphore
from ._sync.handle import LockHandle, MultiLockHandle, SyncLeadership
from ._sync.observe import LeaderObserver
from ._transport.tls import TlsConfig
from ._transport.wire import DEFAULT_ADDRESS
from .errors import (
    AccessDenied,
    DataLoss,
    FencepostError,
    InvalidArgument,
    LeaseLost,
    LimitExceeded,
    LockHeld,
    LockTimeout,
    MissingRecordError,
    NotHolder,
    NotLeaseOwner,
    OutcomeUnknown,
    PermitsMismatch,
    PermissionDenied,
    ResourceExhausted,
    StaleTokenError,
    TlsError,
    Unavailable,
)
from .handle import AsyncLockHandle
from .v1.kinds import HoldKind

try:
    __version__: str = importlib.metadata.version("fencepost")
except importlib.metadata.PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "unknown"

__all__ = [
    "DEFAULT_ADDRESS",
    "AccessDenied",
    "AsyncLockClient",
    "AsyncLockHandle",
    "AsyncMultiLockHandle",
    "AsyncSemaphore",
    "DataLoss",
    "EtcdInfo",
    "FencepostError",
    "HeldLock",
    "HoldKind",
    "InvalidArgument",
    "LeaderInfo",
    "LeaderObserver",
    "Leadership",
    "LeaseLost",
    "LimitExceeded",
    "LockClient",
    "LockHandle",
    "LockHeld",
    "LockInfo",
    "LockTimeout",
    "MissingRecordError",
    "MultiLockHandle",
    "NotHolder",
    "NotLeaseOwner",
    "OutcomeUnknown",
    "PermitHolder",
    "PermitsMismatch",
    "PermissionDenied",
    "ResourceExhausted",
    "Revoked",
    "Semaphore",
    "SemaphoreInfo",
    "ServerInfo",
    "Session",
    "StaleTokenError",
    "SyncLeadership",
    "TlsConfig",
    "TlsError",
    "Unavailable",
]
