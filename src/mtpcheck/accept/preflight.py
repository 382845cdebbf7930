"""What ``accept`` checks before it imports torch or loads a model: each second of a model
load is wasted on a mistyped workload or a checkpoint that cannot be loaded whole."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from mtpcheck.accept.workloads import read_records
from mtpcheck.errors import DamagedInput
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import Checkpoint


def preflight(
    checkpoints: Iterable[Path], workloads: Iterable[Path], trust_pickle: bool = False
) -> list[Checkpoint]:
    """Every workload file reads, and every checkpoint opens without a structural defect (a
    truncated or missing shard, a stale index): a damaged checkpoint is refused
    (:class:`DamagedInput`, exit 1), naming its first defect. Returns the checkpoints as
    opened, for the checks the caller runs next."""
    for path in workloads:
        read_records(path)
    opened = []
    for path in checkpoints:
        ckpt = open_checkpoint(path, trust_pickle)
        opened.append(ckpt)
        if ckpt.issues:
            first = ckpt.issues[0]
            more = f"; {len(ckpt.issues)} defects in all" if len(ckpt.issues) > 1 else ""
            raise DamagedInput(
                ckpt.path,
                f"not measured: {first.subject}: {first.message}{more} "
                f"(`mtpcheck inspect {ckpt.path}` lists every finding)",
            )
    return opened
