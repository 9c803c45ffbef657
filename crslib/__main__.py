"""``python -m crslib`` is the ``crs`` command."""

import sys

from crslib.cli import main

sys.exit(main())
