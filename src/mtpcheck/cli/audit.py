"""``inspect`` and ``diff``; their parameters are generated from their options dataclasses,
:class:`~mtpcheck.checks.options.InspectOptions` and ``DiffOptions``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtpcheck import api
from mtpcheck.checks.options import DiffOptions, InspectOptions
from mtpcheck.cli.app import OutputOptions, RankRun, cli, output_options, report_and_exit
from mtpcheck.cli.declared import built, declared_parameters


@cli.command()
@declared_parameters(InspectOptions)
@output_options
def inspect(opts: OutputOptions, **params: Any) -> None:
    """Audit one checkpoint: MTP family, declared count, layers present, shared copies.

    PATH is a local checkpoint, or a Hugging Face Hub repository (hf://ORG/NAME[@REVISION])
    audited by its headers without downloading weights. A drafter that ships beside its
    model is audited against its own config, and against the model with --target.
    """
    options = built(InspectOptions, params, opts)
    report_and_exit("inspect", lambda: api.inspect_with(options), opts)


@cli.command()
@declared_parameters(DiffOptions)
@output_options
def diff(opts: OutputOptions, **params: Any) -> None:
    """Compare B against A: config keys, then MTP tensors bit for bit (all with --all).

    A and B may be in different formats (HF safetensors, Megatron torch_dist or legacy):
    the HF side is then mapped to Megatron names, bit-exactly. Either may be a Hub repository
    (hf://ORG/NAME[@REVISION]): compared by headers and whole-file sha256, or byte for byte
    by range reads with --fetch.
    """
    options = built(DiffOptions, params, opts)

    def ranked() -> RankRun:
        """The tensor list split across ranks (torch.distributed, gloo); rank 0 reports."""
        from mtpcheck.pipeline.distributed import diff_across_ranks

        o = options
        return lambda on_rank0: diff_across_ranks(
            Path(o.a), Path(o.b), o.all_tensors, o.trust_pickle, on_rank0, o.log
        )

    report_and_exit("diff", lambda: api.diff_with(options), opts, ranked)
