"""Which asyncio event loop a coordinator process runs: uvloop when installed, else the standard one.

``fencepost serve --loop auto|asyncio|uvloop`` (env ``FENCEPOST_LOOP``):
``auto`` (the default) runs uvloop when it can be imported and the standard
asyncio loop otherwise; ``uvloop`` asks for it and is refused (exit 2) when
it is not installed (``pip install 'fencepost[uvloop]'``). grpc.aio runs on
any asyncio loop (since grpcio 1.32): the coordinator's server and its etcd
channels work the same on both. Clients are not concerned: they run on
whatever loop the application runs.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LOOPS", "LoopUnavailable", "describe", "loop_factory", "pick_loop", "run"]

#: The values of ``--loop``.
LOOPS = ("auto", "asyncio", "uvloop")

T = TypeVar("T")


class LoopUnavailable(ValueError):
    """``--loop uvloop`` without uvloop installed, or a ``--loop`` value that is not one of :data:`LOOPS`."""


def _uvloop_version() -> str | None:
    """uvloop's version when it can be imported, else None."""
    try:
        module = importlib.import_module("uvloop")
    except ImportError:
        return None
    return str(getattr(module, "__version__", "?"))


def pick_loop(choice: str) -> str:
    """The loop that ``--loop choice`` runs.

    Args:
        choice: ``"auto"``, ``"asyncio"`` or ``"uvloop"`` (as given; case-insensitive).

    Returns:
        ``"uvloop"`` or ``"asyncio"``: ``auto`` is uvloop when it can be imported.

    Raises:
        LoopUnavailable: ``choice`` is not one of :data:`LOOPS`, or it is
            ``uvloop`` and uvloop cannot be imported (the message says how to
            install it).
    """
    wanted = str(choice).strip().lower()
    if wanted not in LOOPS:
        raise LoopUnavailable(f"--loop is {choice!r}; must be auto, asyncio or uvloop")
    if wanted == "asyncio":
        return "asyncio"
    if _uvloop_version() is not None:
        return "uvloop"
    if wanted == "uvloop":
        raise LoopUnavailable("--loop uvloop: uvloop is not installed; install it with "
                              "pip install 'fencepost[uvloop]', or give --loop auto or asyncio")
    return "asyncio"


def describe(loop: str) -> str:
    """``loop`` with its version for the startup line: ``"uvloop 0.23.0"``, ``"asyncio"``."""
    if loop == "uvloop":
        return f"uvloop {_uvloop_version()}"
    return "asyncio"


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory of ``loop``'s event loops for :class:`asyncio.Runner`; None for the standard one.

    Args:
        loop: a value :func:`pick_loop` returned.
    """
    if loop == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, T], loop: str) -> T:
    """Run ``main`` to completion on a new event loop of kind ``loop``, as :func:`asyncio.run` does.

    Args:
        main: the coroutine (the coordinator's serve).
        loop: a value :func:`pick_loop` returned.

    Returns:
        What ``main`` returned.
    """
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(main)
