"""``fencepost admin``: operator commands run against etcd directly (needs ``fencepost[coordinator]``).

``fencepost admin recover-tokens --above T --etcd-endpoints ...``: after etcd
was restored from a snapshot (or replaced by an older copy of its data),
make every later fencing token greater than T, the highest token ever handed
out (see :func:`~..recipes.tokens.recover` and docs/deploy.md, "Restoring etcd from a
snapshot"). The etcd flags are ``fencepost serve``'s, with the same
environment variables; ``--prefix`` must be the coordinators' own.

Exit status: 0 when the tokens were recovered, 1 when etcd could not be
reached or refused, 2 for a bad flag (one line on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from fencepost.client.errors import FencepostError
from fencepost.client.v1.keys import MAX_TOKEN, Keys

from ..etcd import EtcdAuth, EtcdClient, EtcdTls
from ..recipes.tokens import PROCEDURE, Recovery, record_key, recover
from .coordinator import DEFAULT_PREFIX
from .flags import BadFlag, add_etcd_arguments, etcd_settings

__all__ = ["build_parser", "main"]

HELP = "operator commands on etcd: recover-tokens after an etcd restore (see `fencepost admin --help`)"
"""The one-line help of ``admin`` in ``fencepost --help``."""

RECOVER_HELP = ("after etcd was restored from an older snapshot: make every new fencing token greater than --above "
                "and serve again")


def build_parser() -> argparse.ArgumentParser:
    """The ``fencepost admin`` argument parser."""
    parser = argparse.ArgumentParser(prog="fencepost admin", description="Operator commands run against etcd.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    recover_parser = sub.add_parser(
        "recover-tokens", help=RECOVER_HELP,
        description="After etcd was restored from an older snapshot (or its data replaced by an older copy), "
                    "its revisions restart below fencing tokens already handed out, and the coordinators refuse "
                    "to grant (UNAVAILABLE/DATA_LOSS, health NOT_SERVING). This command, in one etcd "
                    "transaction, deletes every lock key under --prefix (holds and waits restored from the "
                    "snapshot; their holders are told their hold ended) and raises the token floor so that every "
                    "later token is greater than --above, than the restored data's tokens and than every "
                    "coordinator's published highest token. Coordinators serve again within a second, without "
                    f"a restart. See {PROCEDURE}.")
    add_etcd_arguments(recover_parser)
    recover_parser.add_argument("--prefix", default=os.environ.get("FENCEPOST_PREFIX", DEFAULT_PREFIX),
                                help=f"the coordinators' etcd key prefix of all locks (env FENCEPOST_PREFIX; "
                                     f"default {DEFAULT_PREFIX})")
    recover_parser.add_argument("--above", required=True, metavar="T",
                                help="the highest fencing token ever handed out, or more (0 or more): the largest "
                                     "of the highest token your fenced storage holds, the old etcd's last "
                                     "revision plus its old token floor, and the number in the coordinators' "
                                     "ERROR line")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fencepost admin``.

    Args:
        argv: The arguments after ``admin``.

    Returns:
        The exit status: 0 done, 1 etcd unreachable or refused, 2 bad flags.
    """
    args = build_parser().parse_args(argv)
    try:
        endpoints, tls, auth = etcd_settings(args)
        if endpoints is None:
            raise BadFlag("--etcd-endpoints is required (the etcd that was restored)")
        above = _above(args.above)
    except BadFlag as exc:
        print(f"fencepost admin {args.command}: error: {exc}", file=sys.stderr)
        return 2
    try:
        done = asyncio.run(_recover(endpoints, tls, auth, Keys(args.prefix), above))
    except FencepostError as exc:
        print(f"fencepost admin {args.command}: {exc.message}", file=sys.stderr)
        return 1
    keys = Keys(args.prefix)
    was = f"{done.previous.floor}" if done.previous is not None else "none (no token record)"
    deleted = "some" if done.deleted < 0 else str(done.deleted)
    print(f"tokens recovered at etcd revision {done.revision}: token floor {done.record.floor} (was {was}); "
          f"every new fencing token is {done.lowest_token} or more (> {done.record.high}); {deleted} lock keys "
          f"deleted; token record {record_key(keys).decode(errors='replace')} names etcd cluster id "
          f"{done.record.cluster_id:x}", flush=True)
    return 0


def _above(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise BadFlag(f"--above is {text!r}; must be a whole number (the highest fencing token handed out)") from None
    if not 0 <= value < MAX_TOKEN // 2:
        raise BadFlag(f"--above is {value}; must be 0 to {MAX_TOKEN // 2 - 1}")
    return value


async def _recover(endpoints: list[str], tls: EtcdTls | None, auth: EtcdAuth | None, keys: Keys,
                   above: int) -> Recovery:
    etcd = EtcdClient(endpoints, tls=tls, auth=auth)
    try:
        await etcd.connect()
        try:
            return await recover(etcd, keys, above)
        except ValueError as exc:
            raise FencepostError(str(exc)) from exc
    finally:
        await etcd.close()
