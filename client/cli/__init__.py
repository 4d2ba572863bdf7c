"""The ``fencepost`` command line: one module per command.

- ``fencepost serve [flags]`` (:mod:`.serve`): run a coordinator; imports
  ``fencepost.coordinator`` only then (needs ``fencepost[coordinator]``).
- ``fencepost status [NAME]`` (:mod:`.status`): the holder, fencing token,
  TTL left and waiters of one lock, or, without NAME, whether each
  coordinator serves.
- ``fencepost locks [PREFIX]`` (:mod:`.locks`): every held lock (holder
  lease, fencing token, TTL left, held for, waiters) as a table or JSON,
  once or every few seconds (``--watch``).
- ``fencepost acquire NAME`` (:mod:`.acquire`): take a lock, print its
  fencing token, hold it while the client streams keepalives, release it on
  SIGINT/SIGTERM.
- ``fencepost release NAME --lease-id ID --token T`` (:mod:`.release`):
  release a grant by hand.
- ``fencepost run NAME --ttl S -- CMD [ARGS...]`` (:mod:`.run`): run a
  command while holding a lock, with its fencing token in the command's
  environment.
- ``--read`` on ``acquire``, ``run`` and ``release``: a read hold of a
  read-write lock; several NAMEs on them: a multi-lock, every lock or none
  (:mod:`.multilock`). ``status NAME`` and ``locks`` show a read hold's
  mode and readers (:mod:`.holders`).
- ``fencepost elect NAME --value V -- CMD [ARGS...]`` (:mod:`.elect`): run a
  command while leading an election, with the leadership's fencing token in
  its environment; ``fencepost leader NAME [--watch]`` (:mod:`.leader`): the
  election's leader, or each change of it.
- ``fencepost demo`` (:mod:`.demo`): the paused-holder scenario, unfenced
  then fenced; imports the coordinator only when it starts its own.
- ``fencepost admin revoke NAME``, ``fencepost admin sessions [--json]`` (calls to a coordinator) and
  ``fencepost admin recover-tokens --above T [etcd flags]`` (:mod:`.admin`):
  after etcd was restored from an older snapshot, make every new fencing
  token greater than T; imports ``fencepost.coordinator`` only then.

:mod:`.common` holds what they share: the exit codes, flag parsing, and how
a failed call becomes one line. Every failure prints one line to stderr and
exits with a code from :data:`~.common.EXIT_CODES`; no command prints a
traceback for an expected error. ``python -m fencepost.client.cli`` is the
same command; ``fencepost --version`` prints ``fencepost.client.__version__``.
"""

from __future__ import annotations

import argparse
import sys

from fencepost.client import __version__

from . import acquire, admin, demo, elect, leader, locks, release, run, serve, status
from .common import EXIT_INTERRUPTED, EXIT_OK, CliError, Formatter, Parser, epilog

__all__ = ["build_parser", "main"]

#: The commands parsed by :func:`build_parser`, in the order ``--help`` lists them.
COMMANDS = {"status": status, "locks": locks, "acquire": acquire, "release": release, "run": run, "demo": demo,
            "elect": elect, "leader": leader}


def build_parser() -> argparse.ArgumentParser:
    """Build the parser of the ``fencepost`` command (``serve`` is dispatched before it)."""
    parser = Parser(
        prog="fencepost",
        description="Fencepost: locks whose every grant carries a fencing token.",
        epilog=epilog(),
        formatter_class=Formatter,
    )
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {__version__}",
                        help="print the installed version (pyproject.toml's, via importlib.metadata) and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    sub.add_parser("serve", help=serve.HELP, add_help=False)
    sub.add_parser("admin", help=admin.HELP, add_help=False)
    for module in COMMANDS.values():
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``fencepost`` command.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code (see :data:`~.common.EXIT_CODES`).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "serve":
        return serve.execute(args_list[1:])
    if args_list and args_list[0] == "admin":
        return admin.execute(args_list[1:])
    command: list[str] = []
    if args_list and args_list[0] in ("run", "elect") and "--" in args_list:
        split = args_list.index("--")
        args_list, command = args_list[:split], args_list[split + 1:]
    args = build_parser().parse_args(args_list)
    args.argv = command
    prog = f"fencepost {args.command}"
    try:
        return int(COMMANDS[args.command].execute(args))
    except CliError as err:
        print(str(err) if err.bare else f"{prog}: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK
