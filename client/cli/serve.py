"""``fencepost serve [flags]``: run a coordinator (needs the ``fencepost[coordinator]`` extra).

The flags belong to :func:`fencepost.coordinator.process.main.main`, imported only
here, when the command runs: the rest of the command line works without the
coordinator extra.
"""

from __future__ import annotations

import sys

from .common import EXIT_USAGE, err_text

__all__ = ["HELP", "execute"]

HELP = "run a coordinator (see `fencepost serve --help`)"
"""The one-line help of ``serve`` in ``fencepost --help``."""


def execute(argv: list[str]) -> int:
    """Hand ``fencepost serve ARGS...`` over to the coordinator's own main.

    Args:
        argv: The arguments after ``serve``.

    Returns:
        The coordinator's exit code, or 2 when the coordinator cannot be imported.
    """
    try:
        from fencepost.coordinator.process import main as serve
    except ImportError as err:
        missing = getattr(err, "name", None) or str(err)
        if missing.startswith("fencepost"):
            print(f"fencepost serve: cannot import the coordinator: {err_text(err)}", file=sys.stderr)
        else:
            print(f"fencepost serve: the coordinator extra is not installed (missing module "
                  f"{missing}); install it with: pip install 'fencepost[coordinator]'", file=sys.stderr)
        return EXIT_USAGE
    return int(serve.main(argv) or 0)
