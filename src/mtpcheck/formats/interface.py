"""The contract every checkpoint format reader implements."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from mtpcheck.model import Checkpoint


class CheckpointReader(Protocol):
    """Recognises one on-disk format and opens it as a :class:`Checkpoint`."""

    name: str

    def sniff(self, path: Path) -> bool:
        """Return True when ``path`` looks like this format (cheap: names and headers only)."""
        ...

    def open(self, path: Path) -> Checkpoint:
        """Open ``path``; raise :class:`mtpcheck.errors.InputError` when it cannot be read."""
        ...
