"""``fencepost admin COMMAND [flags]``: operator commands on etcd (needs the ``fencepost[coordinator]`` extra).

``fencepost admin recover-tokens --above T --etcd-endpoints ...`` makes every
later fencing token greater than T after etcd was restored from an older
snapshot (docs/deploy.md, "Restoring etcd from a snapshot"). The flags belong
to :func:`fencepost.coordinator.admin.main`, imported only here.
"""

from __future__ import annotations

import sys

from .common import EXIT_USAGE, err_text

__all__ = ["HELP", "execute"]

HELP = "operator commands on etcd: recover-tokens after an etcd restore (see `fencepost admin --help`)"
"""The one-line help of ``admin`` in ``fencepost --help``."""


def execute(argv: list[str]) -> int:
    """Hand ``fencepost admin ARGS...`` over to the coordinator's admin main.

    Args:
        argv: The arguments after ``admin``.

    Returns:
        The command's exit code, or 2 when the coordinator cannot be imported.
    """
    try:
        from fencepost.coordinator import admin
    except ImportError as err:
        missing = getattr(err, "name", None) or str(err)
        if missing.startswith("fencepost"):
            print(f"fencepost admin: cannot import the coordinator: {err_text(err)}", file=sys.stderr)
        else:
            print(f"fencepost admin: the coordinator extra is not installed (missing module "
                  f"{missing}); install it with: pip install 'fencepost[coordinator]'", file=sys.stderr)
        return EXIT_USAGE
    return int(admin.main(argv) or 0)
