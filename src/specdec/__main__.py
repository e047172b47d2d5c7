"""`python -m specdec ...` = the `specdec` command."""

import sys

from .cli import main

sys.exit(main())
