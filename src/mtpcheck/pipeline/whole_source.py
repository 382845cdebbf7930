"""A checkpoint a command loads or measures must hold its whole main model: ``accept``
refuses one that does not before it loads anything (a model loaded without a layer runs on
freshly initialised weights, and its acceptance would measure that)."""

from __future__ import annotations

from mtpcheck.checks.findings import first_failure
from mtpcheck.checks.main_model_checks import main_model_check
from mtpcheck.errors import DamagedInput
from mtpcheck.families import analyse
from mtpcheck.model import Checkpoint


def require_whole_main_model(ckpt: Checkpoint) -> None:
    """Raise :class:`DamagedInput` (exit 1) naming the first main-model finding that fails."""
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    failed = first_failure((main_model_check(ckpt, analysis),))
    if failed is None:
        return
    check, finding = failed
    raise DamagedInput(
        ckpt.path,
        f"not measured: {check.label}: {finding.subject}: {finding.message} "
        f"(`mtpcheck inspect {ckpt.path}` lists every finding)",
    )
