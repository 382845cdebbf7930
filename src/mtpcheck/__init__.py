"""mtpcheck: prove that a checkpoint's Multi-Token-Prediction layers survive.

The Python API (:mod:`mtpcheck.api`) is re-exported here: ``mtpcheck.inspect(path)``,
``mtpcheck.diff(a, b)`` and ``mtpcheck.roundtrip(path)`` return a :class:`Report`; the error
types say why one could not be made. ``accept`` is ``mtpcheck.api.accept``: ``mtpcheck.accept``
is the package that measures it. They are imported on first use, so that ``import mtpcheck``
(and ``mtpcheck --help``) stays quick.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from mtpcheck import api, testing
    from mtpcheck.api import diff, inspect, roundtrip
    from mtpcheck.errors import (
        DamagedInput,
        ExitCode,
        InputError,
        MtpcheckError,
        PathError,
    )
    from mtpcheck.extras import MissingExtra
    from mtpcheck.model import CheckName, CheckResult, FailingFinding, Finding, Report, Status

_LAZY = {
    "inspect": "mtpcheck.api",
    "diff": "mtpcheck.api",
    "roundtrip": "mtpcheck.api",
    "Report": "mtpcheck.model",
    "CheckName": "mtpcheck.model",
    "CheckResult": "mtpcheck.model",
    "FailingFinding": "mtpcheck.model",
    "Finding": "mtpcheck.model",
    "Status": "mtpcheck.model",
    "MtpcheckError": "mtpcheck.errors",
    "PathError": "mtpcheck.errors",
    "InputError": "mtpcheck.errors",
    "DamagedInput": "mtpcheck.errors",
    "ExitCode": "mtpcheck.errors",
    "MissingExtra": "mtpcheck.extras",
}
"""Each public name and the module that defines it."""

_MODULES = ("api", "testing")
"""The public modules, imported on first use too."""

__all__ = [
    "CheckName",
    "CheckResult",
    "DamagedInput",
    "ExitCode",
    "FailingFinding",
    "Finding",
    "InputError",
    "MissingExtra",
    "MtpcheckError",
    "PathError",
    "Report",
    "Status",
    "__version__",
    "api",
    "diff",
    "inspect",
    "roundtrip",
    "testing",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (PEP 562)."""
    if name in _MODULES:
        return import_module(f"mtpcheck.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mtpcheck' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily imported ones included."""
    return sorted({*globals(), *_LAZY, *_MODULES})
