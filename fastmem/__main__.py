"""``python -m fastmem``: the command line (see :mod:`fastmem.cli`)."""

import sys

from .cli import main

sys.exit(main())
