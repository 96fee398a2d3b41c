"""`python -m corepin`."""

from corepin.cli.main import main

raise SystemExit(main())
