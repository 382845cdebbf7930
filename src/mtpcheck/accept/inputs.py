"""What every ``accept`` run opens first: the checkpoints, their MTP analyses and model
folders, and the workloads tokenised once with the reference checkpoint's tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mtpcheck.accept.loading import model_directory
from mtpcheck.accept.options import AcceptOptions
from mtpcheck.accept.workloads import Workload, load_tokenizer, tokenise
from mtpcheck.errors import InputError
from mtpcheck.families import MtpAnalysis, analyse
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import Checkpoint
from mtpcheck.model.config_keys import is_int, text_value


@dataclass(frozen=True)
class Inputs:
    """What an ``accept`` run opened: the checkpoints and the tokenised workloads."""

    checkpoints: tuple[Checkpoint, ...]
    """The checkpoint, then the compared one."""
    analyses: tuple[MtpAnalysis, ...]
    directories: tuple[Path, ...]
    workloads: tuple[Workload, ...]

    @property
    def labels(self) -> tuple[str, ...]:
        """Progress prefixes: ``A: ``/``B: `` with ``--compare``."""
        return ("A: ", "B: ") if len(self.checkpoints) == 2 else ("",)


def _check_vocab(workload: Workload, ckpt: Checkpoint) -> None:
    found = text_value(ckpt.config, "vocab_size", is_int)
    if found is None:
        return
    vocab = found[1]
    top = max((max(s) for s in workload.sequences if s), default=-1)
    if top >= vocab:
        raise InputError(
            workload.path, f"token id {top} is outside {ckpt.path}'s vocabulary ({vocab} ids)"
        )


def open_inputs(options: AcceptOptions) -> Inputs:
    """Open both checkpoints and tokenise every workload; a token id outside a checkpoint's
    vocabulary is refused (exit 2) before any model or engine starts."""
    assert options.checkpoint is not None  # only ``accept --server`` runs without CKPT
    paths = [options.checkpoint] + ([options.compare] if options.compare is not None else [])
    ckpts = tuple(open_checkpoint(p, options.trust_pickle) for p in paths)
    analyses = tuple(analyse(c.config, c.tensors, c.config_path) for c in ckpts)
    directories = tuple(model_directory(c) for c in ckpts)
    tokenizer = load_tokenizer(options.tokenizer or directories[0])
    workloads = tuple(
        tokenise(name, path, tokenizer, options.max_tokens) for name, path in options.workloads
    )
    for workload in workloads:
        for ckpt in ckpts:
            _check_vocab(workload, ckpt)
    return Inputs(ckpts, analyses, directories, workloads)
