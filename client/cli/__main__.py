"""``python -m fencepost.client.cli``: the ``fencepost`` command."""

import sys

from . import main

sys.exit(main())
