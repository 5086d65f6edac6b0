"""``python -m unison.launcher``: the same as `unisonrun`."""

import sys

from .cli import main

sys.exit(main())
