"""Assertions for a converter's own test suite: "the MTP layers survive" in one line.

    from mtpcheck.testing import assert_mtp_intact, assert_mtp_preserved

    def test_conversion_keeps_mtp(tmp_path):
        convert(SOURCE, tmp_path / "out")
        assert_mtp_intact(tmp_path / "out")
        assert_mtp_preserved(SOURCE, tmp_path / "out")

Each raises :class:`AssertionError` whose message lists the report's failing findings, so a
test runner shows what broke; the report is returned when nothing failed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec

from mtpcheck.api import diff, inspect, roundtrip
from mtpcheck.model import Report

P = ParamSpec("P")


def failing_findings(report: Report) -> list[str]:
    """Every finding that fails ``report`` (:meth:`Report.failing_findings`), one line each:
    ``check: subject: message``."""
    return [
        f"{check.label}: {finding.subject}: {finding.message}"
        for check, finding in report.failing_findings()
    ]


def assert_no_findings(report: Report) -> Report:
    """Fail (``AssertionError``) unless ``report`` passes, naming each failing finding."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    failing = failing_findings(report)
    if failing or not report.ok:
        inputs = ", ".join(i.path for i in report.inputs) or "no input"
        lines = "\n".join(f"  - {line}" for line in failing)
        raise AssertionError(
            f"mtpcheck {report.command} ({inputs}): {len(failing)} failing finding(s)\n{lines}"
        )
    return report


def _asserting(command: Callable[P, Report], doc: str) -> Callable[P, Report]:
    """``command`` of :mod:`mtpcheck.api`, asserted to pass: the same parameters, typed from
    its signature (a misspelt keyword is a type error), and its report returned."""

    def asserted(*args: P.args, **kwargs: P.kwargs) -> Report:
        __tracebackhide__ = True
        return assert_no_findings(command(*args, **kwargs))

    asserted.__doc__ = doc
    asserted.__wrapped__ = command  # type: ignore[attr-defined]
    return asserted


assert_mtp_intact = _asserting(
    inspect,
    """The checkpoint at ``path`` declares its MTP layers and holds them whole
    (:func:`mtpcheck.api.inspect` passes; its keywords, e.g. ``target`` for a drafter).""",
)
assert_mtp_preserved = _asserting(
    diff,
    """``b`` holds ``a``'s MTP layers bit for bit, in either format (:func:`mtpcheck.api.diff`
    passes; its keywords, e.g. ``all_tensors``).""",
)
assert_roundtrip = _asserting(
    roundtrip,
    """HF -> Megatron -> HF keeps the MTP layers (:func:`mtpcheck.api.roundtrip` passes; its
    keywords, e.g. your converters as ``to_megatron`` and ``to_hf``).""",
)


def tiny_checkpoint(family: str, dest: str | Path) -> Path:
    """Write a tiny HF checkpoint of ``family`` with its MTP layers at ``dest`` and return it:
    something for a converter's own tests to convert, without this repository's fixtures.

    ``family`` is a ``model_type`` (``deepseek_v3``, ``glm_moe_dsa``, ``qwen3_next``, ...) or
    a release (``GLM-5``, ``DeepSeek-V3.2``) of the published configs mtpcheck ships; the
    checkpoint is that config scaled down as ``roundtrip --synthetic`` scales it (one main
    layer of each kind, every MTP layer, random weights), built by transformers' own model
    class, and it passes ``inspect`` before it is returned. Raises :class:`KeyError` for a
    name with no published config, :class:`ValueError` (nothing left at ``dest``) for one
    that cannot be built or whose build fails its own audit, :class:`FileExistsError` when
    ``dest`` is not an absent or empty folder; needs the ``convert`` extra
    (:class:`~mtpcheck.extras.MissingExtra`).
    """
    from mtpcheck.extras import require

    require("convert", "tiny_checkpoint")
    from mtpcheck.convert.synthetic import build_synthetic
    from mtpcheck.families.published import published_config

    config, dest = published_config(family), Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"{dest}: tiny_checkpoint writes into an absent or empty folder")
    existed = dest.is_dir()
    try:
        built = build_synthetic(config, dest)
        failing = inspect(built).failing
    except Exception as e:
        _remove_built(dest, existed)
        raise ValueError(f"tiny_checkpoint cannot build {config.stem}: {e}") from e
    if failing:
        _remove_built(dest, existed)
        named = ", ".join(map(str, failing))
        raise ValueError(f"tiny_checkpoint: {config.stem}'s tiny build fails {named}")
    return built


def _remove_built(dest: Path, existed: bool) -> None:
    """What a failed build wrote: the folder's contents, and the folder unless it was the
    caller's (given empty)."""
    if not existed:
        shutil.rmtree(dest, ignore_errors=True)
        return
    for child in dest.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


__all__ = [
    "assert_mtp_intact",
    "assert_mtp_preserved",
    "assert_no_findings",
    "assert_roundtrip",
    "failing_findings",
    "tiny_checkpoint",
]
