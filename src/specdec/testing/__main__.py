"""`python -m specdec.testing [NAME ...] --device cuda --profile gpu`: the conformance kit."""

from .cli import main

raise SystemExit(main())
