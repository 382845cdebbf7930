"""Each command's options declared once, on the dataclass the command runs from.

A field made with :func:`option` (or :func:`argument`) carries what the command line needs to
show it: its flag, help, metavar, choices and range. The CLI generates its click parameters
from these fields (:mod:`mtpcheck.cli.declared`), and :mod:`mtpcheck.api` builds the same
dataclass from its keywords, so a default, a choice or a range is written in one place. The
rules between options live on the dataclass too (its ``validate``); both the CLI and the API
call it, so the API refuses exactly what the CLI refuses, with the same one-line message
(:class:`UsageError`, exit 2).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol

from mtpcheck.errors import MtpcheckError

PathKind = Literal["file", "dir", "any"]


class UsageError(MtpcheckError):
    """Options that do not go together, or a value out of its range: the CLI's usage error
    (exit 2), raised by the API for the same call."""


def bad_value(flag: str, reason: str, quoted: bool = False) -> UsageError:
    """A value refused, worded as click words it: ``Invalid value for --x: ...``, and with the
    flag quoted where click itself refuses it (a choice or a range)."""
    name = f"'{flag}'" if quoted else flag
    return UsageError(f"Invalid value for {name}: {reason}")


@dataclass(frozen=True)
class Declared:
    """How one field shows on the command line (the field's own default is the default)."""

    help: str
    flag: str | None = None
    """The option's name; default: ``--`` and the field's name with dashes."""
    metavar: str | None = None
    choices: tuple[str, ...] | type[enum.Enum] | None = None
    """The values allowed: strings, or an enum whose values are the choices."""
    minimum: float | None = None
    maximum: float | None = None
    above: bool = False
    """The minimum itself is not allowed (``> minimum``)."""
    path: PathKind | None = None
    """The value is a path: to a file, a folder, or either."""
    output: bool = False
    """A file mtpcheck writes: refused before any work when it cannot be written."""
    repeatable: bool = False
    """Given any number of times; the field holds a tuple."""
    parse: Callable[[str], Any] | None = None
    """How the command line's text becomes the field's value (ValueError: refused)."""
    required: bool = False
    is_argument: bool = False
    kind: type = str
    """The type of one value on the command line (``str``, ``int``, ``float``, ``bool``)."""


def option(default: Any, help: str, kind: type = str, **how: Any) -> Any:
    """A dataclass field shown as a command-line option (keyword-only in the API)."""
    declared = Declared(help=help, kind=kind, **how)
    if isinstance(default, tuple):
        return field(default_factory=lambda: default, kw_only=True, metadata={"cli": declared})
    return field(default=default, kw_only=True, metadata={"cli": declared})


def required_option(help: str, kind: type = str, positional: bool = False, **how: Any) -> Any:
    """A parameter the API requires (a keyword, or ``positional``), shown as an option the
    command line requires."""
    declared = Declared(help=help, kind=kind, required=True, **how)
    return field(kw_only=not positional, metadata={"cli": declared})


def argument(help: str, required: bool = True, **how: Any) -> Any:
    """A dataclass field shown as a positional argument, positional in the API too. One that is
    not ``required`` may be left out on the command line (None), and is still passed, as None,
    to the API, so that the parameters after it can be positional too."""
    declared = Declared(help=help, is_argument=True, required=required, **how)
    return field(metadata={"cli": declared})


def internal(default: Any) -> Any:
    """A field the API takes that is not a command-line option of its own (the CLI fills it
    from its shared options, such as ``--trust-pickle`` or the progress log)."""
    return field(default=default, kw_only=True, compare=False, repr=False)


def silent(_line: str) -> None:
    """The default progress log: lines are dropped."""


class Options(Protocol):
    """A command's options dataclass."""

    def validate(self) -> None:
        """Raise :class:`UsageError` for options that do not go together."""


def declared_fields(cls: type) -> Iterator[tuple[Field[Any], Declared]]:
    """The fields of ``cls`` that the command line shows, in order."""
    for f in fields(cls):
        declared = f.metadata.get("cli")
        if isinstance(declared, Declared):
            yield f, declared


def flag_of(f: Field[Any], declared: Declared) -> str:
    """The option's name on the command line (an argument's: its name in capitals)."""
    if declared.is_argument:
        return declared.metavar or f.name.upper()
    return declared.flag or "--" + f.name.replace("_", "-")


def default_of(f: Field[Any]) -> Any:
    """The field's default (None for a required field)."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def given(options: object) -> list[str]:
    """The flags of the options set to other than their defaults, in declaration order."""
    return [
        flag_of(f, d)
        for f, d in declared_fields(type(options))
        if not d.is_argument and getattr(options, f.name) != default_of(f)
    ]


def flag(options: object, name: str) -> str:
    """The command-line flag of the field ``name``."""
    for f, declared in declared_fields(type(options)):
        if f.name == name:
            return flag_of(f, declared)
    raise KeyError(name)


def check_fields(options: object) -> None:
    """Each declared value within its choices and range, each output file writable."""
    for f, declared in declared_fields(type(options)):
        value = getattr(options, f.name)
        values = value if declared.repeatable else (value,)
        for one in values:
            if one is not None:
                _check_value(flag_of(f, declared), declared, one)


def choice_values(declared: Declared) -> tuple[str, ...] | None:
    """The values allowed, as the command line writes them (an enum's by their values)."""
    if isinstance(declared.choices, type):
        return tuple(str(c.value) for c in declared.choices)
    return declared.choices


def _check_value(name: str, declared: Declared, value: Any) -> None:
    choices = choice_values(declared)
    if choices is not None and str(getattr(value, "value", value)) not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise bad_value(name, f"{value!r} is not one of {listed}.", quoted=True)
    if declared.minimum is not None or declared.maximum is not None:
        _check_range(name, declared, value)
    if declared.output:
        check_output_path(name, Path(value))


def _check_range(name: str, declared: Declared, value: Any) -> None:
    low, high = declared.minimum, declared.maximum
    low_ok = low is None or (value > low if declared.above else value >= low)
    if low_ok and (high is None or value <= high):
        return
    bound = "x>" if declared.above else "x>="
    shown = f"{bound}{low}" if high is None else f"{low}<=x<={high}"
    raise bad_value(name, f"{value} is not in the range {shown}.", quoted=True)


def check_output_path(name: str, path: Path | None) -> None:
    """Refuse a path mtpcheck is to write that cannot be written, before any work is done."""
    if path is None:
        return
    if str(path) in ("", "."):
        raise bad_value(name, "empty path (is the variable it came from unset?)")
    if path.is_dir():
        raise bad_value(name, f"{path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise bad_value(name, f"{parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise bad_value(name, f"{path} is not writable")
