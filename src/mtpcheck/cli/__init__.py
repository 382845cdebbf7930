"""Command line: parse options, call :mod:`mtpcheck.api`, render, map to an exit code.

Each module registers its commands on the group in :mod:`mtpcheck.cli.app`; nothing below
``cli`` imports it.
"""

from mtpcheck.cli import acceptance, audit, conversion  # noqa: F401  (register commands)
from mtpcheck.cli.app import cli, execute, main

__all__ = ["cli", "execute", "main"]
