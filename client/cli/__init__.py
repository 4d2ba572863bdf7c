"""The ``fencepost`` command line.

Commands:

- ``fencepost serve [flags]``: run a coordinator (needs ``fencepost[coordinator]``);
  the flags belong to :func:`fencepost.coordinator.server.main`.
- ``fencepost status [NAME]``: the holder, fencing token, TTL left and waiters of
  one lock, or, without NAME, whether the coordinator serves.
- ``fencepost acquire NAME``: take a lock, print its fencing token, hold it while
  the client streams keepalives, release it on SIGINT/SIGTERM.
- ``fencepost release NAME --lease-id ID --token T``: release a grant by hand.
- ``fencepost run NAME --ttl S -- CMD [ARGS...]``: run a command while holding a
  lock, with its fencing token in the command's environment (:mod:`fencepost.client.run`).
- ``fencepost demo``: the paused-holder scenario, unfenced then fenced
  (:mod:`fencepost.client.demo`).

Every failure prints one line to stderr and exits with a code from
:data:`EXIT_CODES`; no command prints a traceback for an expected error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import grpc

DEFAULT_ADDRESS = "127.0.0.1:7420"
"""The coordinator address used when neither --address nor FENCEPOST_ADDRESS is set."""

ADDRESS_ENV = "FENCEPOST_ADDRESS"
"""Environment variable holding the default coordinator address(es), comma-separated."""

RPC_TIMEOUT_SECONDS = 5.0
"""Deadline of each unary call made by ``status`` and ``release``, in seconds."""

MIN_TTL_SECONDS = 1.0
MAX_TTL_SECONDS = 86400.0
"""TTL range the API accepts, in seconds (LeaseGrantRequest.ttl_seconds)."""

EXIT_OK = 0
EXIT_UNAVAILABLE = 1
EXIT_USAGE = 2
EXIT_LOST = 3
EXIT_TIMEOUT = 4
EXIT_HELD = 5
EXIT_PRECONDITION = 6
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "success (acquire: released after SIGINT/SIGTERM)",
    EXIT_UNAVAILABLE: "coordinator unreachable or not serving, or another server error",
    EXIT_USAGE: "bad input: a flag, a lock name, a TTL, a lease id or a token",
    EXIT_LOST: "acquire, run: the lease or the lock was lost while holding it",
    EXIT_TIMEOUT: "acquire, run: --timeout passed before the lock was granted",
    EXIT_HELD: "acquire --try, run --try: the lock is held by someone else",
    EXIT_PRECONDITION: "release: not released (NOT_HOLDER, STALE_TOKEN or LEASE_EXPIRED)",
    EXIT_INTERRUPTED: "acquire, run: interrupted before the lock was granted",
}

RUN_EXIT_CODES: dict[str, str] = {
    "N": "the command's own exit status (128+N when signal N killed it)",
    str(EXIT_UNAVAILABLE): "coordinator unreachable or not serving, or another server error",
    str(EXIT_USAGE): "bad input: a flag, a lock name, a TTL; or no command after --",
    str(EXIT_LOST): "the hold was lost while the command ran: the command got SIGTERM, then "
                    "SIGKILL after --grace (--lost-exit-code changes 3)",
    str(EXIT_TIMEOUT): "--timeout passed before the lock was granted; the command did not run",
    str(EXIT_HELD): "--try: the lock is held by someone else; the command did not run",
    "126": "the command could not be executed",
    "127": "the command was not found",
    str(EXIT_INTERRUPTED): "interrupted before the lock was granted; the command did not run",
}
"""Exit codes of ``fencepost run``. A command that exits 1 to 5 itself is told
apart from fencepost's own failures only by the one-line message on stderr
(and, for 3, by choosing another --lost-exit-code)."""

DEMO_EXIT_CODES: dict[int, str] = {
    EXIT_OK: "the fenced run kept B's write (the demo showed what it should)",
    EXIT_UNAVAILABLE: "the fenced run lost B's write, or the demo could not run "
                      "(etcd, coordinator, database or a worker failed)",
    EXIT_USAGE: "bad input, or a missing optional package (matplotlib for --plot, "
                "psycopg for --dsn)",
    EXIT_INTERRUPTED: "interrupted",
}

HEALTH_SERVICE = "fencepost.v1.LockService"
PROBE_NAME = "fencepost-cli-health-probe"

_T = TypeVar("_T")


class CliError(Exception):
    """An expected failure: printed as one line, exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int, *, bare: bool = False) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.bare = bare  # print without the "fencepost COMMAND: " prefix


# ---------------------------------------------------------------------------
# Argument parsing
# ---------------------------------------------------------------------------


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Wraps the description like the default formatter, keeps the epilog's layout."""

    def add_text(self, text: str | None) -> None:
        if text and not text.startswith("exit codes:"):
            text = textwrap.fill(" ".join(text.split()), width=78)
        super().add_text(text)


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose errors are one line: ``fencepost acquire: error: ...``."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _ttl(text: str) -> float:
    """Parse --ttl: seconds, > 0 and <= 86400."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"ttl must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or not MIN_TTL_SECONDS <= value <= MAX_TTL_SECONDS:
        raise argparse.ArgumentTypeError(
            f"ttl must be {MIN_TTL_SECONDS:g} to {MAX_TTL_SECONDS:g} seconds, got {text}")
    return value


def _timeout(text: str) -> float:
    """Parse --timeout: seconds, >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"timeout must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or value > MAX_TTL_SECONDS:
        raise argparse.ArgumentTypeError(
            f"timeout must be >= 0 and <= {MAX_TTL_SECONDS:g} seconds, got {text}")
    return value


def parse_lease_id(text: str) -> int:
    """Parse a lease id given in decimal or as 0x-hex.

    Args:
        text: ``"7587867312345"`` or ``"0x6e6c8e1c9a"``.

    Returns:
        The lease id, > 0.

    Raises:
        argparse.ArgumentTypeError: not a positive integer.
    """
    s = text.strip().lower()
    try:
        value = int(s[2:], 16) if s.startswith("0x") else int(s, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"lease-id must be a decimal or 0x-hex integer, got {text!r}") from None
    if value <= 0 or value >= 2**63:
        raise argparse.ArgumentTypeError(f"lease-id must be > 0 and < 2**63, got {text}")
    return value


def _token(text: str) -> int:
    """Parse --token: a positive integer."""
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"token must be a positive integer, got {text!r}") from None
    if value <= 0 or value >= 2**63:
        raise argparse.ArgumentTypeError(f"token must be > 0 and < 2**63, got {text}")
    return value


def parse_addresses(values: Sequence[str] | None, env: str | None = None) -> list[str]:
    """Collect coordinator addresses from --address flags or FENCEPOST_ADDRESS.

    Args:
        values: the --address values, each ``HOST:PORT`` or a comma-separated list.
        env: the FENCEPOST_ADDRESS value, used when ``values`` is empty.

    Returns:
        The addresses in order, without duplicates; ``[DEFAULT_ADDRESS]`` when none is given.

    Raises:
        CliError: an address is not ``HOST:PORT`` (exit 2).
    """
    raw = list(values or []) or ([env] if env else [])
    out: list[str] = []
    for item in raw:
        for part in item.split(","):
            addr = part.strip()
            if not addr:
                continue
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise CliError(f"address must be HOST:PORT, got {addr!r}", EXIT_USAGE)
            if addr not in out:
                out.append(addr)
    return out or [DEFAULT_ADDRESS]


def _epilog() -> str:
    lines = ["exit codes:"]
    lines += [f"  {code:<4} {text}" for code, text in EXIT_CODES.items()]
    lines += [
        "",
        f"The coordinator address comes from --address, else ${ADDRESS_ENV}, else {DEFAULT_ADDRESS}.",
    ]
    return "\n".join(lines)


def _run_epilog() -> str:
    lines = ["exit codes:"]
    lines += [f"  {code:<4} {text}" for code, text in RUN_EXIT_CODES.items()]
    lines += [
        "",
        "The command's environment gets FENCEPOST_LOCK (the lock name), FENCEPOST_TOKEN (the",
        "fencing token), FENCEPOST_LEASE_ID (decimal), FENCEPOST_TTL (granted TTL, seconds)",
        "and FENCEPOST_ADDRESS (the coordinator addresses, comma-separated).",
        "SIGINT, SIGTERM and SIGHUP sent to fencepost run are forwarded to the command.",
        "",
        f"The coordinator address comes from --address, else ${ADDRESS_ENV}, else {DEFAULT_ADDRESS}.",
    ]
    return "\n".join(lines)


def _demo_epilog() -> str:
    lines = ["exit codes:"]
    lines += [f"  {code:<4} {text}" for code, text in DEMO_EXIT_CODES.items()]
    return "\n".join(lines)


def _grace(text: str) -> float:
    """Parse --grace: seconds, >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"grace must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"grace must be 0 to 3600 seconds, got {text}")
    return value


def _exit_code(text: str) -> int:
    """Parse --lost-exit-code: 1 to 255."""
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"lost-exit-code must be an integer, got {text!r}") from None
    if not 1 <= value <= 255:
        raise argparse.ArgumentTypeError(f"lost-exit-code must be 1 to 255, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Build the parser of the ``fencepost`` command (``serve`` is dispatched before it)."""
    fmt = _Formatter
    parser = _Parser(
        prog="fencepost",
        description="Fencepost: locks whose every grant carries a fencing token.",
        epilog=_epilog(),
        formatter_class=fmt,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    common = _Parser(add_help=False)
    common.add_argument(
        "--address", action="append", metavar="HOST:PORT",
        help=f"coordinator address; repeat or comma-separate for several "
             f"(env {ADDRESS_ENV}, default {DEFAULT_ADDRESS})")

    sub.add_parser(
        "serve", help="run a coordinator (see `fencepost serve --help`)", add_help=False)

    p = sub.add_parser(
        "status", parents=[common], formatter_class=fmt, epilog=_epilog(),
        help="show a lock's holder, token and waiters, or whether the coordinator serves",
        description="With NAME: the holder's lease id, fencing token, TTL left and waiters "
                    "of that lock. Without NAME: whether each coordinator serves.")
    p.add_argument("name", nargs="?", metavar="NAME", help="lock name")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser(
        "acquire", parents=[common], formatter_class=fmt, epilog=_epilog(),
        help="take a lock, print its fencing token, hold it until interrupted",
        description="Take the lock NAME, print its fencing token on the first line of "
                    "stdout, then hold it (streaming keepalives) until SIGINT or SIGTERM, "
                    "and release it.")
    p.add_argument("name", metavar="NAME", help="lock name")
    p.add_argument("--ttl", type=_ttl, default=10.0, metavar="S",
                   help="lease TTL in seconds, 1 to 86400 (default 10)")
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--timeout", type=_timeout, default=None, metavar="S",
                      help="give up after S seconds of waiting (default: wait forever)")
    wait.add_argument("--try", dest="try_once", action="store_true",
                      help="try once; exit 5 if the lock is held")

    p = sub.add_parser(
        "release", parents=[common], formatter_class=fmt, epilog=_epilog(),
        help="release a grant by lease id and fencing token",
        description="Release the lock NAME held by lease ID under fencing token T.")
    p.add_argument("name", metavar="NAME", help="lock name")
    p.add_argument("--lease-id", required=True, type=parse_lease_id, metavar="ID",
                   help="holder's lease id, decimal or 0x-hex")
    p.add_argument("--token", required=True, type=_token, metavar="T",
                   help="fencing token of the grant")

    p = sub.add_parser(
        "run", parents=[common], formatter_class=fmt, epilog=_run_epilog(),
        usage="fencepost run NAME --ttl S [--timeout S | --try] [--grace S] "
              "[--lost-exit-code N] [--address HOST:PORT] -- CMD [ARGS...]",
        help="run a command while holding a lock; the command gets the fencing token",
        description="Take the lock NAME, run CMD with the fencing token in its environment "
                    "while the client streams keepalives, and release the lock when CMD "
                    "exits. If the hold is lost first, CMD gets SIGTERM, then SIGKILL after "
                    "--grace seconds. Exits with CMD's status.")
    p.add_argument("name", metavar="NAME", help="lock name")
    p.add_argument("--ttl", type=_ttl, required=True, metavar="S",
                   help="lease TTL in seconds, 1 to 86400")
    wait = p.add_mutually_exclusive_group()
    wait.add_argument("--timeout", type=_timeout, default=None, metavar="S",
                      help="give up after S seconds of waiting, exit 4 (default: wait forever)")
    wait.add_argument("--try", dest="try_once", action="store_true",
                      help="try once; exit 5 if the lock is held")
    p.add_argument("--grace", type=_grace, default=5.0, metavar="S",
                   help="seconds between SIGTERM and SIGKILL after the hold is lost (default 5)")
    p.add_argument("--lost-exit-code", type=_exit_code, default=EXIT_LOST, metavar="N",
                   help=f"exit code when the hold is lost while CMD runs (default {EXIT_LOST})")

    p = sub.add_parser(
        "demo", formatter_class=fmt, epilog=_demo_epilog(),
        help="replay the paused-holder failure, without and with fencing",
        description="Run the paused-holder scenario twice with real processes: worker A takes "
                    "a lock, is frozen (SIGSTOP) past its TTL, worker B takes the lock and "
                    "writes version 2, A wakes up and writes version 1. First with a plain "
                    "UPDATE (B's write is lost), then with the fencing token checked by the "
                    "SQL guard (A's write is rejected). Starts its own etcd and coordinator "
                    "unless --target is given; the invoices table is in a temporary SQLite "
                    "file unless --dsn is given.")
    p.add_argument("--target", metavar="HOST:PORT",
                   help="use this running coordinator instead of an embedded etcd + coordinator")
    p.add_argument("--dsn", metavar="DSN",
                   help="PostgreSQL connection string (needs psycopg); the demo creates and "
                        "drops the table fencepost_demo_invoices there")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw both timelines side by side into FILE.png (needs matplotlib)")
    p.add_argument("--ttl", type=_ttl, default=2.0, metavar="S",
                   help="the workers' lease TTL in seconds (default 2)")
    return parser


# ---------------------------------------------------------------------------
# gRPC helpers
# ---------------------------------------------------------------------------


def error_info(err: grpc.RpcError) -> tuple[str | None, dict[str, str]]:
    """Read the google.rpc.ErrorInfo reason and metadata from a failed call.

    Args:
        err: the error a sync stub call raised (it is also a ``grpc.Call``).

    Returns:
        ``(reason, metadata)``; ``(None, {})`` when the status carries no ErrorInfo
        (for example when the coordinator could not be reached at all).
    """
    try:
        from google.rpc import error_details_pb2
        from grpc_status import rpc_status

        status = rpc_status.from_call(err)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a malformed status is just "no details"
        return None, {}
    if status is None:
        return None, {}
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason or None, dict(info.metadata)
    return None, {}


def _code(err: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(err, "code", None)
    return code() if callable(code) else None


def _details(err: grpc.RpcError) -> str:
    details = getattr(err, "details", None)
    text = details() if callable(details) else None
    return (text or "").strip().splitlines()[0] if text else ""


def _unreachable(err: grpc.RpcError) -> bool:
    """True when the call never reached a coordinator (no ErrorInfo, UNAVAILABLE)."""
    return _code(err) == grpc.StatusCode.UNAVAILABLE and error_info(err)[0] is None


def _describe_rpc_error(address: str, err: grpc.RpcError, what: str) -> CliError:
    """Turn a failed call into one line and an exit code."""
    code = _code(err)
    reason, meta = error_info(err)
    if _unreachable(err) or code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return CliError(f"cannot reach the coordinator at {address}: {_details(err) or code}",
                        EXIT_UNAVAILABLE)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field = meta.get("field", "request")
        return CliError(f"invalid {field}: {_details(err)}", EXIT_USAGE)
    label = code.name if code is not None else "error"
    if reason:
        label += f"/{reason}"
    return CliError(f"{what} failed at {address}: {label}: {_details(err)}", EXIT_UNAVAILABLE)


def _call_first(addresses: Sequence[str], call: Callable[[grpc.Channel], _T]) -> tuple[str, _T]:
    """Run ``call`` on a channel to each address in turn until one is reachable.

    Returns:
        The address that answered and the call's result.

    Raises:
        grpc.RpcError: the last address's error, or the first error that came from a
            coordinator (only unreachable addresses are skipped).
    """
    last: grpc.RpcError | None = None
    for address in addresses:
        with grpc.insecure_channel(address) as channel:
            try:
                return address, call(channel)
            except grpc.RpcError as err:
                if not _unreachable(err):
                    setattr(err, "fencepost_address", address)
                    raise
                setattr(err, "fencepost_address", address)
                last = err
    assert last is not None
    raise last


def _lease_hex(lease_id: int) -> str:
    return f"0x{lease_id:x}"


# ---------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------


def _status_lock(addresses: list[str], name: str, as_json: bool) -> int:
    from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

    def describe(channel: grpc.Channel) -> Any:
        stub = lock_pb2_grpc.LockServiceStub(channel)
        return stub.Describe(lock_pb2.DescribeRequest(name=name), timeout=RPC_TIMEOUT_SECONDS)

    try:
        address, resp = _call_first(addresses, describe)
    except grpc.RpcError as err:
        raise _describe_rpc_error(getattr(err, "fencepost_address", addresses[-1]), err,
                                  "Describe") from None
    waiters = [{"lease_id": w.lease_id, "lease_id_hex": _lease_hex(w.lease_id),
                "revision": w.token} for w in resp.waiters]
    if as_json:
        obj: dict[str, Any] = {
            "name": name,
            "address": address,
            "held": resp.held,
            "holder": ({"lease_id": resp.holder.lease_id,
                        "lease_id_hex": _lease_hex(resp.holder.lease_id),
                        "token": resp.holder.token} if resp.held else None),
            "token": resp.holder.token if resp.held else None,
            "ttl_remaining_seconds": resp.ttl_remaining_seconds,
            "ttl_seconds": resp.ttl_seconds,
            "waiter_count": resp.waiter_count,
            "waiters": waiters,
            "revision": resp.revision,
        }
        print(json.dumps(obj))
        return EXIT_OK
    if resp.held:
        lease = resp.holder.lease_id
        print(f"{name}: held")
        print(f"  holder lease   {_lease_hex(lease)} ({lease})")
        print(f"  fencing token  {resp.holder.token}")
        print(f"  TTL left       {resp.ttl_remaining_seconds} s of {resp.ttl_seconds} s")
    else:
        print(f"{name}: not held")
    print(f"  waiters        {resp.waiter_count}")
    for i, w in enumerate(waiters[:10], 1):
        print(f"    {i}. lease {w['lease_id_hex']} ({w['lease_id']}), queued at revision {w['revision']}")
    if resp.waiter_count > 10:
        print(f"    ... and {resp.waiter_count - 10} more")
    print(f"  revision       {resp.revision}")
    return EXIT_OK


def _health_one(address: str) -> tuple[str, str]:
    """Ask one coordinator whether it serves.

    Returns:
        ``(status, detail)``; status is SERVING, NOT_SERVING, UNREACHABLE or an error name.
    """
    with grpc.insecure_channel(address) as channel:
        try:
            from grpc_health.v1 import health_pb2, health_pb2_grpc
        except ImportError:
            return _health_by_describe(channel)
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            try:
                resp = stub.Check(health_pb2.HealthCheckRequest(service=HEALTH_SERVICE),
                                  timeout=RPC_TIMEOUT_SECONDS)
            except grpc.RpcError as err:
                # No health service, or one that does not know LockService (another gRPC
                # server, an etcd say): only a LockService call can tell whether it serves.
                if _code(err) not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED):
                    raise
                return _health_by_describe(channel)
        except grpc.RpcError as err:
            if _unreachable(err) or _code(err) == grpc.StatusCode.DEADLINE_EXCEEDED:
                return "UNREACHABLE", _details(err)
            return (_code(err) or grpc.StatusCode.UNKNOWN).name, _details(err)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status), ""


def _health_by_describe(channel: grpc.Channel) -> tuple[str, str]:
    """Fallback without grpc_health: a Describe that succeeds means the coordinator serves."""
    from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

    stub = lock_pb2_grpc.LockServiceStub(channel)
    try:
        stub.Describe(lock_pb2.DescribeRequest(name=PROBE_NAME), timeout=RPC_TIMEOUT_SECONDS)
    except grpc.RpcError as err:
        if _unreachable(err) or _code(err) == grpc.StatusCode.DEADLINE_EXCEEDED:
            return "UNREACHABLE", _details(err)
        if _code(err) == grpc.StatusCode.UNAVAILABLE:
            return "NOT_SERVING", error_info(err)[0] or _details(err)
        return (_code(err) or grpc.StatusCode.UNKNOWN).name, _details(err)
    return "SERVING", ""


def _status_health(addresses: list[str], as_json: bool) -> int:
    results = [(a, *_health_one(a)) for a in addresses]
    serving = all(status == "SERVING" for _, status, _ in results)
    if as_json:
        print(json.dumps({
            "serving": serving,
            "coordinators": [{"address": a, "status": s, **({"detail": d} if d else {})}
                             for a, s, d in results],
        }))
    else:
        for address, status, detail in results:
            line = f"coordinator {address}: {status}"
            print(line + (f" ({detail})" if detail and status != "SERVING" else ""))
    if not serving:
        bad = [a for a, s, _ in results if s != "SERVING"]
        print(f"fencepost status: not serving: {', '.join(bad)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return EXIT_OK


def cmd_status(args: argparse.Namespace, addresses: list[str]) -> int:
    """``fencepost status [NAME]``."""
    if args.name is None:
        return _status_health(addresses, args.json)
    return _status_lock(addresses, args.name, args.json)


# ---------------------------------------------------------------------------
# release
# ---------------------------------------------------------------------------


def cmd_release(args: argparse.Namespace, addresses: list[str]) -> int:
    """``fencepost release NAME --lease-id ID --token T``: one raw Release call."""
    from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

    req = lock_pb2.ReleaseRequest(name=args.name, lease_id=args.lease_id, token=args.token)

    def release(channel: grpc.Channel) -> Any:
        return lock_pb2_grpc.LockServiceStub(channel).Release(req, timeout=RPC_TIMEOUT_SECONDS)

    try:
        _call_first(addresses, release)
    except grpc.RpcError as err:
        address = getattr(err, "fencepost_address", addresses[-1])
        if _code(err) == grpc.StatusCode.FAILED_PRECONDITION:
            reason, _ = error_info(err)
            raise CliError(
                f"not released: {reason or 'FAILED_PRECONDITION'}: {args.name} "
                f"lease {_lease_hex(args.lease_id)} ({args.lease_id}) token {args.token}"
                + (f": {_details(err)}" if _details(err) else ""),
                EXIT_PRECONDITION) from None
        raise _describe_rpc_error(address, err, "Release") from None
    print("released")
    return EXIT_OK


# ---------------------------------------------------------------------------
# acquire
# ---------------------------------------------------------------------------


def _err_text(err: BaseException) -> str:
    text = (getattr(err, "message", None) or str(err)).strip()
    return text.splitlines()[0] if text else type(err).__name__


async def _acquire_and_hold(args: argparse.Namespace, addresses: list[str]) -> int:
    """Acquire, print the token, hold until a signal or the loss, release.

    SIGINT and SIGTERM only set an event: nothing is interrupted half-way, the
    acquire is cancelled (which removes the waiter's place in the queue) or the
    hold is released, and the client closes its stream on the way out.
    """
    from fencepost.client import AsyncLockClient
    from fencepost.client.run import acquire_unless

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        async with AsyncLockClient(addresses) as client:
            handle = await acquire_unless(client, args.name, ttl=args.ttl, timeout=args.timeout,
                                          try_once=args.try_once, interrupt=stop.wait())
            if handle is None:
                raise CliError(f"interrupted while waiting for {args.name}", EXIT_INTERRUPTED)

            print(handle.token, flush=True)
            print(f"fencepost: holding {handle.name} with token {handle.token}, lease "
                  f"{_lease_hex(handle.lease_id)} ({handle.lease_id}), ttl {handle.ttl:g} s; "
                  f"SIGINT or SIGTERM releases it",
                  file=sys.stderr, flush=True)

            lost = asyncio.ensure_future(handle.lost.wait())
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait({lost, stopping}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                lost.cancel()
                stopping.cancel()
            if handle.lost.is_set():
                raise CliError(f"lost: {handle.lost_reason or 'lease lost'}", EXIT_LOST, bare=True)
            await handle.release()
            print(f"fencepost: released {handle.name} (token {handle.token})",
                  file=sys.stderr, flush=True)
            return EXIT_OK
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


def cmd_acquire(args: argparse.Namespace, addresses: list[str]) -> int:
    """``fencepost acquire NAME [--ttl S] [--timeout S | --try]``."""
    from fencepost.client import FencepostError

    try:
        return asyncio.run(_acquire_and_hold(args, addresses))
    except (FencepostError, grpc.RpcError) as err:
        raise _acquire_error(err, args.name, args.timeout, addresses) from None


def _acquire_error(err: Exception, name: str, timeout: float | None,
                   addresses: list[str]) -> CliError:
    """Map a client error raised while acquiring or holding lock ``name`` to a CliError.

    Args:
        err: a FencepostError or grpc.RpcError.
        name: the lock name.
        timeout: the --timeout value, for the LockTimeout message.
        addresses: the coordinator addresses.

    Returns:
        The CliError to raise (shared by ``acquire`` and ``run``).
    """
    from fencepost.client import (
        InvalidArgument,
        LeaseLost,
        LockHeld,
        LockTimeout,
        NotHolder,
        StaleTokenError,
        Unavailable,
    )

    if isinstance(err, grpc.RpcError):
        return _describe_rpc_error(", ".join(addresses), err, "acquire")
    if isinstance(err, InvalidArgument):
        field = getattr(err, "field", None) or "request"
        return CliError(f"invalid {field}: {_err_text(err)}", EXIT_USAGE)
    if isinstance(err, LockTimeout):
        return CliError(f"timeout: {name} not granted within {timeout or 0:g} s", EXIT_TIMEOUT)
    if isinstance(err, LockHeld):
        lease = getattr(err, "holder_lease_id", None)
        token = getattr(err, "holder_token", None)
        who = f" by lease {_lease_hex(lease)} ({lease}) with token {token}" if lease else ""
        return CliError(f"held: {name} is held{who}", EXIT_HELD)
    if isinstance(err, (LeaseLost, NotHolder, StaleTokenError)):
        reason = getattr(err, "reason", None) or type(err).__name__
        return CliError(f"lost: {reason}: {_err_text(err)}", EXIT_LOST, bare=True)
    if isinstance(err, Unavailable):
        return CliError(f"coordinator unavailable at {', '.join(addresses)}: {_err_text(err)}",
                        EXIT_UNAVAILABLE)
    reason = getattr(err, "reason", None)
    label = f"{type(err).__name__}" + (f"/{reason}" if reason else "")
    return CliError(f"{label}: {_err_text(err)}", EXIT_UNAVAILABLE)


# ---------------------------------------------------------------------------
# run and demo
# ---------------------------------------------------------------------------


def cmd_run(args: argparse.Namespace, addresses: list[str], command: list[str]) -> int:
    """``fencepost run NAME --ttl S [...] -- CMD [ARGS...]`` (see :mod:`fencepost.client.run`)."""
    from fencepost.client import FencepostError
    from fencepost.client.run import CommandError, run_locked

    try:
        result = asyncio.run(run_locked(
            addresses, args.name, command, ttl=args.ttl, timeout=args.timeout,
            try_once=args.try_once, grace=args.grace, lost_exit_code=args.lost_exit_code,
            interrupted_exit_code=EXIT_INTERRUPTED))
    except CommandError as err:
        raise CliError(str(err), err.exit_code) from None
    except (FencepostError, grpc.RpcError) as err:
        cli_err = _acquire_error(err, args.name, args.timeout, addresses)
        if cli_err.exit_code in (EXIT_TIMEOUT, EXIT_HELD):
            cli_err = CliError(f"{cli_err}; command not run", cli_err.exit_code)
        raise cli_err from None
    if result.message:
        print(result.message if result.lost_reason else f"fencepost run: {result.message}",
              file=sys.stderr, flush=True)
    return result.exit_code


def cmd_demo(args: argparse.Namespace) -> int:
    """``fencepost demo [--target HOST:PORT] [--dsn DSN] [--plot FILE.png] [--ttl S]``."""
    from fencepost.client.demo import DemoError, main as demo_main

    try:
        return demo_main(target=args.target, dsn=args.dsn, plot=args.plot, ttl=args.ttl)
    except DemoError as err:
        raise CliError(str(err), err.exit_code) from None


# ---------------------------------------------------------------------------
# serve and main
# ---------------------------------------------------------------------------


def cmd_serve(argv: list[str]) -> int:
    """``fencepost serve [flags]``: hand over to the coordinator's own main."""
    try:
        from fencepost.coordinator import server
    except ImportError as err:
        missing = getattr(err, "name", None) or str(err)
        if missing.startswith("fencepost"):
            print(f"fencepost serve: cannot import the coordinator: {_err_text(err)}",
                  file=sys.stderr)
        else:
            print(f"fencepost serve: the coordinator extra is not installed (missing module "
                  f"{missing}); install it with: pip install 'fencepost[coordinator]'",
                  file=sys.stderr)
        return EXIT_USAGE
    return int(server.main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    """Run the ``fencepost`` command.

    Args:
        argv: the arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code (see :data:`EXIT_CODES`).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "serve":
        return cmd_serve(args_list[1:])
    parser = build_parser()
    command: list[str] = []
    if args_list and args_list[0] == "run" and "--" in args_list:
        split = args_list.index("--")
        args_list, command = args_list[:split], args_list[split + 1:]
    args = parser.parse_args(args_list)
    prog = f"fencepost {args.command}"
    try:
        if args.command == "demo":
            return cmd_demo(args)
        addresses = parse_addresses(args.address, os.environ.get(ADDRESS_ENV))
        if args.command == "run":
            if not command:
                raise CliError("no command: give it after --, as in "
                               "fencepost run NAME --ttl S -- CMD [ARGS...]", EXIT_USAGE)
            return cmd_run(args, addresses, command)
        if args.command == "status":
            return cmd_status(args, addresses)
        if args.command == "acquire":
            return cmd_acquire(args, addresses)
        if args.command == "release":
            return cmd_release(args, addresses)
        parser.error(f"unknown command {args.command!r}")
    except CliError as err:
        print(str(err) if err.bare else f"{prog}: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
