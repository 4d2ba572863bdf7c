"""Fencepost client: lock clients, lease handles and the fencepost command line.

A TTL lock is not mutual exclusion: pass ``handle.token`` (the fencing token)
to the storage with every write, and let it reject writes that carry a token
lower than one it has accepted. See :class:`AsyncLockClient`.
"""

from ._aio.client import AsyncLockClient
from ._info import EtcdInfo, HeldLock, LockInfo, Revoked, ServerInfo, Session
from ._recipes.election import LeaderInfo, Leadership
from ._recipes.semaphore import AsyncSemaphore, PermitHolder, SemaphoreInfo
from ._sync.client import LockClient, Semaphore
from ._sync.handle import LockHandle, SyncLeadership
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

__all__ = [
    "DEFAULT_ADDRESS",
    "AccessDenied",
    "AsyncLockClient",
    "AsyncLockHandle",
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
