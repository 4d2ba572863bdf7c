"""Giving memory back after a flood of streams: one full cycle collection, then glibc's free pages.

A flood of KeepAlive streams grows the process by hundreds of MiB (10,000
streams: about 170 MiB of Python heap and 450 MiB of RSS at the peak).
When it ends, the objects are freed (:mod:`.stream` leaves no reference
cycle; gRPC's method lookup leaves a small one per call, for the cycle
collector), but glibc's malloc keeps the freed pages in its arenas: RSS
stayed 120-230 MiB above its baseline 65 s after such a flood, and
``malloc_trim(0)`` gave back 50-120 MiB of it (docs/operations.md, "Memory
after floods of streams and names"). :func:`release_memory` does both, the
trim in a worker thread (ctypes releases the GIL: the event loop runs on).
Where the C library has no ``malloc_trim`` (musl, macOS) only the
collection runs.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
from collections.abc import Callable

__all__ = ["MALLOC_TRIM", "release_memory"]


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``; None when the C library has none."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


#: glibc's ``malloc_trim``; None when the C library has none.
MALLOC_TRIM = _malloc_trim()


async def release_memory() -> None:
    """Collect every generation, then give glibc's free heap pages back to the system (tens of milliseconds)."""
    gc.collect()
    if MALLOC_TRIM is not None:
        await asyncio.get_running_loop().run_in_executor(None, MALLOC_TRIM, 0)
