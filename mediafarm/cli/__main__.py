"""``python -m mediafarm.cli``: the ``farm`` command without its installed script."""

import sys

from mediafarm.cli.app import main

sys.exit(main())
