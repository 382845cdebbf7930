"""The parts every checkpoint-measuring ``accept`` report shares (teacher-forced and
``--engine``): one check per workload, the ``B - A`` line of ``--compare``, the served-copies
check and what the report says about each input checkpoint."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mtpcheck.accept.copies import COPIES_TITLE
from mtpcheck.accept.inputs import Inputs
from mtpcheck.families import summarise
from mtpcheck.model import CheckName, CheckpointSummary, CheckResult, Finding, Status


def compared_finding(message: str, details: Mapping[str, Any]) -> Finding:
    """The ``B - A`` line of one workload under ``--compare`` (information, never a verdict)."""
    return Finding("B - A", Status.INFO, message, details)


def workload_checks(
    inputs: Inputs,
    title: str,
    findings: Mapping[str, Sequence[Finding]],
    served: Sequence[Finding],
) -> tuple[CheckResult, ...]:
    """One check per workload, in the workloads' order, titled ``{title} on workload NAME``
    and reported as ``acceptance/NAME``;
    then the served-copies check where a stored copy differs from its main tensor."""
    checks = [
        CheckResult(
            CheckName.ACCEPTANCE,
            f"{title} on workload {w.name}",
            tuple(findings[w.name]),
            workload=w.name,
        )
        for w in inputs.workloads
    ]
    if served:
        checks.append(CheckResult(CheckName.SERVED_COPIES, COPIES_TITLE, tuple(served)))
    return tuple(checks)


def input_summaries(inputs: Inputs) -> tuple[CheckpointSummary, ...]:
    """What the report says about the checkpoint (and the compared one)."""
    pairs = zip(inputs.checkpoints, inputs.analyses, strict=True)
    return tuple(summarise(c, a) for c, a in pairs)
