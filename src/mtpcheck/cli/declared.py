"""click parameters generated from an options dataclass (:mod:`mtpcheck.declared`)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import Field, fields
from pathlib import Path
from typing import Any, TypeVar

import click

from mtpcheck.cli.app import Decorator, OutputOptions, apply
from mtpcheck.declared import (
    Declared,
    Options,
    UsageError,
    choice_values,
    declared_fields,
    default_of,
    flag_of,
)

OptionsT = TypeVar("OptionsT", bound=Options)


def declared_parameters(cls: type) -> Decorator:
    """click's arguments and options for every declared field of ``cls``, in field order; the
    command receives them under the fields' names."""
    return apply([_parameter(f, d) for f, d in declared_fields(cls)])


def built(cls: Callable[..., OptionsT], params: dict[str, Any], opts: OutputOptions) -> OptionsT:
    """``cls`` from click's parameters and the shared options it takes (``--trust-pickle``,
    the progress log), validated: a :class:`~mtpcheck.declared.UsageError` (exit 2) before any
    work, as the API raises it for the same call."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    shared = {"trust_pickle": opts.trust_pickle, "log": opts.log}
    options = cls(**params, **{k: v for k, v in shared.items() if k in names})
    try:
        options.validate()
    except UsageError as e:  # click's own kind, so that click ends the command with exit 2
        raise click.UsageError(str(e)) from e
    return options


def _parameter(f: Field[Any], declared: Declared) -> Decorator:
    kind = _click_type(declared)
    callback = _callback(declared)
    if declared.is_argument:
        required = declared.required
        metavar = declared.metavar
        if metavar is not None and not required:
            metavar = f"[{metavar}]"
        return click.argument(
            f.name, type=kind, required=required, callback=callback, metavar=metavar
        )
    if declared.kind is bool:
        name, default = flag_of(f, declared), bool(default_of(f))
        if "/" in name:  # --x/--no-x, its default shown
            return click.option(
                name, f.name, default=default, show_default=True, help=declared.help
            )
        return click.option(name, f.name, is_flag=True, help=declared.help)
    default = default_of(f)
    shown = default not in (None, ()) and not declared.repeatable
    return click.option(
        flag_of(f, declared),
        f.name,
        type=kind,
        default=_shown_default(default),
        show_default=shown,
        multiple=declared.repeatable,
        required=declared.required,
        metavar=declared.metavar,
        callback=callback,
        help=declared.help,
    )


def _shown_default(default: Any) -> Any:
    """The default as the command line would write it (an enum by its value)."""
    if isinstance(default, enum.Enum):
        return default.value
    return None if default == () else default


def _click_type(declared: Declared) -> click.ParamType[Any] | None:
    """The click type of one value."""
    if declared.path is not None:
        return click.Path(
            file_okay=declared.path != "dir",
            dir_okay=declared.path != "file",
            path_type=Path,
        )
    choices = choice_values(declared)
    if choices is not None:
        return click.Choice(choices)
    low, high = declared.minimum, declared.maximum
    if declared.kind is int and (low is not None or high is not None):
        as_int = (None if low is None else int(low), None if high is None else int(high))
        return click.IntRange(*as_int, min_open=declared.above)
    if declared.kind is float and (low is not None or high is not None):
        return click.FloatRange(low, high, min_open=declared.above)
    plain: dict[type, click.ParamType[Any]] = {int: click.INT, float: click.FLOAT}
    return plain.get(declared.kind)


def _callback(declared: Declared) -> Callable[[click.Context, click.Parameter, Any], Any] | None:
    """What turns the command line's text into the field's value: the declared parse (its
    ValueError a usage error naming the option), or an enum by its value."""
    parse, choices = declared.parse, declared.choices
    if parse is not None:

        def parsed(_ctx: click.Context, param: click.Parameter, value: Any) -> Any:
            try:
                if declared.repeatable:
                    return tuple(parse(v) for v in value)
                return None if value is None else parse(value)
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint=param.opts[0]) from e

        return parsed
    if isinstance(choices, type) and issubclass(choices, enum.Enum):
        enum_type = choices
        return lambda _ctx, _param, value: None if value is None else enum_type(value)
    return None
