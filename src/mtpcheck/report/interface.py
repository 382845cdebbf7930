"""The contract every report renderer implements."""

from __future__ import annotations

from typing import Protocol, TextIO

from mtpcheck.model import Report


class Renderer(Protocol):
    """Writes a finished :class:`Report` to a text stream; computes nothing."""

    name: str
    """The name the CLI knows the format by."""

    def render(self, report: Report, stream: TextIO) -> None:
        """Write ``report`` to ``stream``."""
