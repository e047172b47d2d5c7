"""`python -m specdec.train ...` (see `specdec.train.cli`)."""

import sys

from .cli import main

sys.exit(main())
