"""The JSON forms of the report's values, shared by the sections."""

from __future__ import annotations

from typing import Any, Protocol

from mtpcheck.model import Estimate, Share


def pick(obj: object, names: str) -> dict[str, Any]:
    """The named attributes of ``obj`` (space-separated, in JSON key order), tuples as lists."""
    picked = {name: getattr(obj, name) for name in names.split()}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in picked.items()}


def interval(e: Estimate) -> list[float | None]:
    """The JSON form of a 95 % interval: ``[low, high]``."""
    return [e.low, e.high]


def estimate(e: Estimate) -> dict[str, float | None]:
    """The JSON form of an estimate: value and interval bounds."""
    return {"value": e.value, "low": e.low, "high": e.high}


def share(s: Share) -> dict[str, Any]:
    """The JSON form of a share over requests: its estimate and standard error."""
    return {**estimate(s.estimate), "error": s.error}


class _Rates(Protocol):
    """Anything with greedy and alpha acceptance: an offline result, a depth, a delta."""

    @property
    def greedy(self) -> Estimate: ...

    @property
    def alpha(self) -> Estimate: ...


def rates(r: _Rates) -> dict[str, Any]:
    """The JSON form of greedy and alpha acceptance, each with its interval."""
    return {
        "greedy": r.greedy.value,
        "greedy_ci": interval(r.greedy),
        "alpha": r.alpha.value,
        "alpha_ci": interval(r.alpha),
    }
