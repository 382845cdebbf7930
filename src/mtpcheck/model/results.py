"""What checks find and what a finished run reports: findings, check results, tensor
comparisons, input summaries and the report the renderers read."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from mtpcheck.model.acceptance import (
    AcceptanceDelta,
    AcceptanceResult,
    EngineAcceptance,
    EngineDelta,
    OnlineAcceptance,
    ServerAcceptance,
)
from mtpcheck.model.check_names import CheckName


class Status(str, enum.Enum):
    """Outcome of one check or finding. Only FAIL makes a verdict fail."""

    PASS = "pass"
    """Checked, and found as it should be."""
    FAIL = "fail"
    """Checked, and found damaged, missing or inconsistent: the verdict fails (exit 1)."""
    WARN = "warn"
    """Worth a look, not a failure: the verdict still passes (a dtype widened with every value
    kept, a drafter left as it was while the main model moved)."""
    SKIP = "skip"
    """Not checked; the message says why (nothing in the input the check applies to)."""
    INFO = "info"
    """Context, neither pass nor problem (a figure measured and not judged)."""


@dataclass(frozen=True)
class Finding:
    """One observation of a check about one subject (a tensor, a key, a layer)."""

    subject: str
    status: Status
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class CheckResult:
    """The findings of one named check; it fails when any finding fails."""

    name: CheckName
    title: str
    findings: tuple[Finding, ...]
    workload: str | None = None
    """``acceptance`` only: the workload it measured; reports name the check
    ``acceptance/WORKLOAD`` (:attr:`label`)."""

    @property
    def label(self) -> str:
        """The check's name as reports print it: ``acceptance/WORKLOAD`` for a workload's
        check, the plain name otherwise."""
        name = str(self.name)  # a CheckName prints as its value
        return name if self.workload is None else f"{name}/{self.workload}"

    @property
    def status(self) -> Status:
        """The worst status among the findings (FAIL, WARN, PASS, INFO in that order); SKIP
        when there are none."""
        statuses = {f.status for f in self.findings}
        for s in (Status.FAIL, Status.WARN, Status.PASS, Status.INFO):
            if s in statuses:
                return s
        return Status.SKIP


class TensorStatus(str, enum.Enum):
    """Verdict of the tensor matcher for one tensor name."""

    EQUAL = "equal"
    """Same dtype, shape and bytes on both sides."""
    MISSING = "missing"
    """In A, absent in B."""
    EXTRA = "extra"
    """In B, absent in A."""
    SHAPE_CHANGED = "shape_changed"
    """The shapes differ; the bytes are not compared."""
    DTYPE_CHANGED = "dtype_changed"
    """The dtypes differ; ``values_differing`` counts the values that changed where both
    types can be decoded."""
    BITS_DIFFER = "bits_differ"
    """Same dtype and shape, other bytes (``differing_elements``, ``first_difference``)."""
    UNREADABLE = "unreadable"
    """A side's bytes cannot be read (its file ends before the tensor does)."""
    NOT_COMPARED = "not_compared"
    """Same dtype and shape, bytes not at hand (a Hub repository read by its headers)."""
    QUANTIZED = "quantized"
    """One parameter stored in different forms, one of them quantized (BF16 in A, packed
    INT4 + scales in B): not comparable byte for byte; ``diff --dequantize`` compares values."""


@dataclass(frozen=True)
class TensorComparison:
    """Byte-level comparison of one tensor between two checkpoints."""

    name: str
    status: TensorStatus
    dtype: tuple[str | None, str | None]
    shape: tuple[tuple[int, ...] | None, tuple[int, ...] | None]
    nbytes: int = 0
    differing_elements: int = 0
    first_difference: tuple[int, ...] | None = None
    """Index (in the tensor's shape) of the first differing element."""
    max_abs_diff: float | None = None
    """Context only: the verdict is decided by bytes, never by this value."""
    storage: tuple[str, str] | None = None
    """QUANTIZED only: how each side stores the parameter (``BF16``, ``INT4: weight_packed
    I32 [8, 4] + weight_scale BF16 [8, 1]``)."""
    values_differing: int | None = None
    """DTYPE_CHANGED only, context: elements whose values differ once the narrower float type
    is widened exactly (0: every value survived the change); None: not such a pair of types."""
    steps: float | None = None
    """QUANTIZED, dequantized: the largest difference between B's dequantized values and A's,
    in units of B's quantization step there (at most about 0.5 when B rounds A)."""


@dataclass(frozen=True)
class MtpLayerReport:
    """One MTP layer as found in a checkpoint."""

    index: int
    prefix: str
    present: tuple[str, ...]
    missing: tuple[str, ...]
    nbytes: int
    dtypes: tuple[str, ...]
    unreadable: tuple[str, ...] = ()
    """Present tensors whose bytes the files do not hold in full (a truncated shard)."""

    @property
    def complete(self) -> bool:
        """Every tensor the layer needs is there and readable."""
        return not self.missing and not self.unreadable


@dataclass(frozen=True)
class CheckpointSummary:
    """What mtpcheck learned about one input checkpoint."""

    path: str
    format: str
    family: str | None
    """Registry key of the MTP family, or None when unknown."""
    family_display: str
    model_type: str | None
    declared_mtp: int | None
    declared_by: str
    """Which config key declared the count, or why none did."""
    num_hidden_layers: int | None
    tensor_count: int
    total_bytes: int
    mtp_layers: tuple[MtpLayerReport, ...]


class FailingFinding(NamedTuple):
    """A finding that fails the run, with the check it belongs to
    (:meth:`Report.failing_findings`)."""

    check: CheckResult
    finding: Finding


@dataclass(frozen=True)
class Report:
    """A finished run: inputs, checks, tensor comparisons. Renderers only read this."""

    command: str
    inputs: tuple[CheckpointSummary, ...]
    checks: tuple[CheckResult, ...]
    tensors: tuple[TensorComparison, ...] = ()
    acceptance: tuple[AcceptanceResult, ...] = ()
    """``accept`` only: one entry per (checkpoint, workload), reference checkpoint first."""
    acceptance_deltas: tuple[AcceptanceDelta, ...] = ()
    """``accept --compare`` only: compared minus reference, one entry per workload."""
    online: tuple[OnlineAcceptance, ...] = ()
    """``accept --online`` only: one entry per (checkpoint, workload) with a drafter."""
    engine: tuple[EngineAcceptance, ...] = ()
    """``accept --engine`` only: one entry per (checkpoint, workload) the engine ran."""
    engine_deltas: tuple[EngineDelta, ...] = ()
    """``accept --engine --compare`` only: compared minus reference, one entry per workload."""
    server: tuple[ServerAcceptance, ...] = ()
    """``accept --server`` only: one entry per workload sent to the running server."""
    strict: bool = False
    """``--strict``: a check that warns fails the run too."""

    def fails(self, check: CheckResult) -> bool:
        """Whether ``check`` fails the run: it failed, or with :attr:`strict` it warned."""
        return check.status is Status.FAIL or (self.strict and check.status is Status.WARN)

    @property
    def failing(self) -> tuple[str, ...]:
        """The names of the checks that fail the run (:meth:`fails`), in report order, as
        reports print them (:attr:`CheckResult.label`)."""
        return tuple(c.label for c in self.checks if self.fails(c))

    def failing_findings(self) -> tuple[FailingFinding, ...]:
        """Every finding that fails the run, with its check, in report order: each FAIL, and
        under :attr:`strict` each WARN too."""
        return tuple(
            FailingFinding(check, finding)
            for check in self.checks
            for finding in check.findings
            if finding.status is Status.FAIL or (self.strict and finding.status is Status.WARN)
        )

    @property
    def ok(self) -> bool:
        """True when no check fails the run (:attr:`failing`)."""
        return not self.failing

    def check(self, name: CheckName | str) -> CheckResult:
        """The check named ``name`` (``CheckName.MTP_COUNT``, or as reports print it:
        ``mtp-count``, ``acceptance/chat``); a KeyError naming the report's checks where it
        has none of that name."""
        wanted = str(name)
        for found in self.checks:
            if found.label == wanted:
                return found
        raise KeyError(
            f"no check {wanted!r} in this report: {', '.join(c.label for c in self.checks)}"
        )
