"""Entry point for ``python -m mtpcheck``."""

from mtpcheck.cli import main

raise SystemExit(main())
