#!/usr/bin/env python3
"""Run Fencepost's deployment on this machine, without containers, until Ctrl-C.

Usage::

    python deploy/local/run.py [--dir DIR] [--tls | --no-tls] [--coordinator-tls | --no-coordinator-tls]

Starts on 127.0.0.1 what the compose file describes: a 3-member etcd cluster
(TLS on client and peer URLs unless ``--no-tls``) and 2 ``fencepost serve``
coordinators given all three members; prints the addresses and the
environment a client needs; runs until Ctrl-C (or SIGTERM), then stops the
coordinators and the members (SIGTERM, SIGKILL after a timeout). A second
Ctrl-C while stopping kills everything at once.

Without ``--dir`` everything lives in a new temporary directory, removed at
the end. With ``--dir`` the directory is kept: a later run on it restarts the
same cluster, with its locks, on the same ports. See deploy/local/README.md.

Exit status: 0 after Ctrl-C or SIGTERM, 1 when something could not start or
a process exited on its own, 2 for bad flags.
"""

from __future__ import annotations

import argparse
import fcntl
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launch import LocalDeployment, print_summary  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command line parser."""
    parser = argparse.ArgumentParser(prog="run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", metavar="DIR",
                        help="the deployment's directory, kept (default: a temporary one, removed at the end)")
    parser.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True,
                        help="TLS with client certificates on etcd's client and peer URLs (default: on)")
    parser.add_argument("--coordinator-tls", action=argparse.BooleanOptionalAction, default=True,
                        help="mTLS between clients and coordinators (default: on)")
    parser.add_argument("--log-level", default="INFO", help="the coordinators' --log-level (default INFO)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the deployment until interrupted; returns the exit status."""
    args = build_parser().parse_args(argv)
    if args.dir is not None and Path(args.dir).exists() and not Path(args.dir).is_dir():
        print(f"run.py: error: --dir {args.dir} is not a directory", file=sys.stderr)
        return 2
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="fencepost-local-"))
    base.mkdir(parents=True, exist_ok=True)
    # One run.py per directory: held until this process ends (the kernel drops it if it is killed).
    owner = open(base / "run.lock", "a")  # noqa: SIM115
    try:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"run.py: error: a deployment is already running in {base} (another run.py holds "
              f"{base / 'run.lock'}); use its addresses, or another --dir", file=sys.stderr)
        return 2
    dep = LocalDeployment(base, etcd_tls=args.tls, coordinator_tls=args.coordinator_tls, log_level=args.log_level)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():  # the second Ctrl-C: no more waiting
            raise KeyboardInterrupt
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    status = 0
    try:
        try:
            print(f"starting in {base} ...", flush=True)
            dep.start()
        except (RuntimeError, OSError) as exc:
            print(f"run.py: cannot start: {exc}", file=sys.stderr)
            return 1
        if not stop.is_set():
            print_summary(dep)
            print("\nrunning; Ctrl-C stops everything", flush=True)
        reported: set[str] = set()
        while not stop.wait(1.0):
            for name, code in dep.exited():
                if name not in reported:
                    reported.add(name)
                    status = 1
                    how = (f"was killed by {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals()
                           else f"exited with status {code}")
                    print(f"run.py: {name} {how}; the others keep running (Ctrl-C stops them, then run.py "
                          f"exits 1; run.py --dir DIR again restarts it); see {dep.log_path(name)}",
                          file=sys.stderr, flush=True)
        print("stopping the coordinators, then etcd ...", flush=True)
        dep.stop()
        print("stopped", flush=True)
        return status
    except KeyboardInterrupt:
        print("killing everything", flush=True)
        return 1
    finally:
        dep.kill()  # no-op after a clean stop; SIGKILL for whatever still runs
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
