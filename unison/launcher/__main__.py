"""``python -m unison.launcher``: the same as `unisonrun`."""

import sys

from ._cli import main

sys.exit(main())
