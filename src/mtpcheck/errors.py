"""Error types and the exit-code contract shared by every layer."""

from __future__ import annotations

import enum
from pathlib import Path


class ExitCode(enum.IntEnum):
    """Documented process exit codes."""

    OK = 0
    FINDINGS = 1
    BAD_INPUT = 2
    INTERNAL = 3
    INTERRUPTED = 130


class MtpcheckError(Exception):
    """Base class of every error mtpcheck raises on purpose."""


class InputError(MtpcheckError):
    """An input file or directory is unreadable or malformed (exit 2).

    The message always reads ``"{path}: {reason}"`` so that a single line tells the user
    which file is at fault and why.
    """

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


class HeaderError(InputError):
    """A safetensors header is malformed."""


class ConfigError(InputError):
    """A config.json is unreadable, not JSON, or declares impossible values."""
