"""The optional parts of mtpcheck: each extra, what it enables and the modules it brings.

``pip install mtpcheck`` is the core: ``inspect`` and ``diff`` of safetensors, GGUF and Megatron
checkpoints, local or ``hf://``, and ``accept --server``; none of them imports torch. Commands
that build or run models need an extra (pyproject.toml's ``[project.optional-dependencies]``
lists the packages; tests/test_extras.py holds the two lists together). A command whose extra
is missing stops before any work with one line naming the extra to install.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from mtpcheck.errors import MtpcheckError


@dataclass(frozen=True)
class Extra:
    """An optional dependency group of the package (``pip install mtpcheck[name]``) and what it
    enables."""

    name: str
    modules: tuple[str, ...]
    """Import names of the packages it brings, as the commands import them."""
    enables: str


EXTRAS: dict[str, Extra] = {
    extra.name: extra
    for extra in (
        Extra(
            "convert",
            ("torch", "transformers", "megatron.core", "safetensors"),
            "convert, roundtrip",
        ),
        Extra("accept", ("torch", "transformers", "safetensors"), "accept on a checkpoint"),
        Extra("plot", ("matplotlib",), "accept --plot"),
        Extra("vllm", ("vllm",), "accept --engine vllm"),
    )
}

_DISTRIBUTIONS = {"megatron.core": "megatron-core"}
"""Package names where they differ from the import name."""


class MissingExtra(MtpcheckError):
    """A command needs packages the installed extras do not bring (exit 2)."""


def _installed(module: str) -> bool:
    """Whether ``module`` can be imported, found without importing anything (a dotted name's
    package would run its ``__init__``: megatron's imports half of megatron-core)."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):  # refused by an import hook, or a broken package
        return False
    if spec is None:
        return False
    if not rest:
        return True
    inside = rest.replace(".", "/")
    return any(
        (Path(where) / inside).is_dir() or (Path(where) / f"{inside}.py").is_file()
        for where in spec.submodule_search_locations or ()
    )


def missing(extra: str) -> list[str]:
    """The packages of ``extra`` that are not installed, by package name."""
    return [_DISTRIBUTIONS.get(m, m) for m in EXTRAS[extra].modules if not _installed(m)]


def require(extra: str, what: str) -> None:
    """Raise :class:`MissingExtra` unless every package of ``extra`` is installed."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(_message(extra, what, absent))


def for_missing_module(module: str, command: str) -> MissingExtra | None:
    """The error to show for an import of ``module`` that failed during ``command``, where an
    extra brings that module (None for any other module: then it is a bug of ours)."""
    top = module.split(".")[0]
    preferred = {"roundtrip": "convert", "convert": "convert", "accept": "accept"}.get(command)
    candidates = [preferred] if preferred else []
    candidates += [name for name in EXTRAS if name != preferred]
    for name in candidates:
        for brought in EXTRAS[name].modules:
            if brought.split(".")[0] == top:
                package = _DISTRIBUTIONS.get(brought, brought)
                return MissingExtra(_message(name, command, [package]))
    return None


def _message(extra: str, what: str, absent: list[str]) -> str:
    return (
        f"{what} needs {', '.join(absent)}, which the installed mtpcheck lacks: "
        f"pip install 'mtpcheck[{extra}]'"
    )
