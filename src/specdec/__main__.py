"""`python -m specdec ...` = the `specdec` command."""

import sys

from .entrypoints.cli import main

sys.exit(main())
