"""Error types and the exit-code contract shared by every layer."""

from __future__ import annotations

import enum
import reprlib
from pathlib import Path


class ExitCode(enum.IntEnum):
    """Documented process exit codes."""

    OK = 0
    FINDINGS = 1
    BAD_INPUT = 2
    INTERNAL = 3
    INTERRUPTED = 130


_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, 0x85) if c != 0x09}
_ESCAPES.update({0x0A: "\\n", 0x0D: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})


def one_line(text: str) -> str:
    """``text`` with line breaks and other control characters escaped (a file or tensor name
    may hold any of them), so that an error message stays on one line."""
    return text.translate(_ESCAPES)


class _Short(reprlib.Repr):
    """``reprlib``'s short repr, also of an int too long for ``repr`` (Python refuses to
    write one of more than 4300 digits)."""

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:
            return f"<an int of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_REPR = _Short()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 80, 80, 40


def shown(value: object, limit: int = 60) -> str:
    """``value`` as a message quotes input: its ``repr``, three levels deep at most and cut to
    ``limit`` characters (a file may hold a value of any length or depth)."""
    if isinstance(value, str):  # a name: whole, up to the limit
        return shown_text(repr(value[: limit + 1]), limit)
    return shown_text(_REPR.repr(value), limit)


def shown_text(text: str, limit: int = 300) -> str:
    """``text`` that may quote input (a library's error message), cut to ``limit`` characters."""
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


_PACKAGE = str(Path(__file__).resolve().parent)


class RefusedInput(ValueError):
    """What mtpcheck raises on purpose about input, below the code that knows the file (a
    stand-in called with wrong arguments, a pickle changing what it was handed): the caller
    words it for the file; never a bug of ours."""


def raised_by_us(e: BaseException) -> bool:
    """Whether ``e``, caught where mtpcheck hands input to a library (an unpickler, a parser),
    is a bug of mtpcheck's own: raised in a frame of mtpcheck's below the one that caught it,
    and no error mtpcheck raises on purpose. Raised by the library itself, or by what it
    calls outside mtpcheck, it is the input's."""
    if isinstance(e, (MtpcheckError, RefusedInput)):
        return False
    tb = e.__traceback__
    if tb is None or tb.tb_next is None:  # raised in the library's own code
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.startswith(_PACKAGE)


class MtpcheckError(Exception):
    """Base class of every error mtpcheck raises on purpose."""


class PathError(MtpcheckError):
    """An error about one file or folder. The message always reads ``"{path}: {reason}"`` on
    a single line (see :func:`one_line`), so that it tells the user which file is at fault and
    why."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{one_line(self.path)}: {one_line(reason)}")

    def __reduce__(self) -> tuple[type[PathError], tuple[str, str]]:
        # rebuilt from (path, reason), not from the message: errors cross process boundaries
        # (torch.distributed's object collectives, torchrun ranks) by pickle
        return type(self), (self.path, self.reason)


class InputError(PathError):
    """An input file or directory is unreadable or malformed (exit 2)."""


class HeaderError(InputError):
    """A safetensors header is malformed."""


class ConfigError(InputError):
    """A config.json is unreadable, not JSON, or declares impossible values."""


class DamagedInput(PathError):
    """A readable checkpoint with a defect that a command will not work from (``convert`` of a
    source that fails its audit): a finding about the checkpoint, exit 1."""


class ConfigKeyError(ConfigError):
    """A config.json lacks a key mtpcheck needs, or holds it as no integer where one is needed;
    raised where the key is read. Code that reads a config without knowing its file raises it
    at ``config.json``; whoever knows the file names it (:meth:`at`)."""

    def __init__(
        self, key: str, needed_by: str, path: str | Path = "config.json", found: str = ""
    ) -> None:
        self.key = key
        self.needed_by = needed_by
        self.found = found
        """The value the config holds, as a message quotes it; empty where it holds none."""
        if found:
            reason = f"{key} is {found}, where {needed_by} needs an integer"
        else:
            reason = f"the config lacks {key}, which {needed_by} needs"
        super().__init__(path, reason)

    def at(self, path: str | Path) -> ConfigKeyError:
        """The same error, naming the file the config was read from."""
        return ConfigKeyError(self.key, self.needed_by, path, self.found)

    def __reduce__(self) -> tuple[type[ConfigKeyError], tuple[str, str, str, str]]:  # type: ignore[override]
        return type(self), (self.key, self.needed_by, self.path, self.found)
