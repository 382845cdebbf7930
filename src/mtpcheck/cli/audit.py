"""``inspect`` and ``diff``, and the torchrun plumbing ``diff`` and ``roundtrip`` share."""

from __future__ import annotations

from pathlib import Path

import click

from mtpcheck import api
from mtpcheck.cli.app import (
    MEGATRON_LAYOUT,
    OutputOptions,
    RankRun,
    cli,
    output_options,
    report_and_exit,
)
from mtpcheck.layouts import MegatronLayout
from mtpcheck.model import Report

FETCH = click.option(
    "--fetch",
    is_flag=True,
    help="For hf:// inputs: read the tensor bytes a check needs by HTTP range (shared copies "
    "in inspect; the compared tensors in diff). Without it only headers are fetched.",
)


@cli.command()
@click.argument("path")
@FETCH
@click.option(
    "--draft",
    metavar="DRAFT",
    help="For a GGUF target written without its nextn layer (llama.cpp's --no-mtp): the MTP "
    "draft file split off from it (--mtp, mtp-NAME.gguf); the two are audited as one model.",
)
@click.option(
    "--target",
    metavar="TARGET",
    help="For a drafter that ships beside its model (EAGLE-3, DFlash, an exported MTP layer): "
    "the model it is served with, local or hf://; the pair is checked together.",
)
@output_options
def inspect(
    path: str, fetch: bool, draft: str | None, target: str | None, opts: OutputOptions
) -> None:
    """Audit one checkpoint: MTP family, declared count, layers present, shared copies.

    PATH is a local checkpoint, or a Hugging Face Hub repository (hf://ORG/NAME[@REVISION])
    audited by its headers without downloading weights. A drafter that ships beside its
    model is audited against its own config, and against the model with --target.
    """

    def build() -> Report:
        return api.inspect(
            path,
            draft=draft,
            target=target,
            fetch=fetch,
            trust_pickle=opts.trust_pickle,
            log=opts.log,
        )

    report_and_exit("inspect", build, opts)


@cli.command()
@click.argument("a")
@click.argument("b")
@click.option(
    "--all", "all_tensors", is_flag=True, help="Compare every tensor, not only the MTP scope."
)
@click.option(
    "--dequantize",
    is_flag=True,
    help="Dequantize tensors one side stores quantized and measure them against the other "
    "side's full-precision values, in quantization steps (FP8, INT8, packed INTn, NVFP4; GGUF "
    "Q8_0, Q4_K, Q6_K).",
)
@FETCH
@MEGATRON_LAYOUT
@output_options
def diff(
    a: str,
    b: str,
    all_tensors: bool,
    dequantize: bool,
    fetch: bool,
    megatron_layout: MegatronLayout,
    opts: OutputOptions,
) -> None:
    """Compare B against A: config keys, then MTP tensors bit for bit (all with --all).

    A and B may be in different formats (HF safetensors, Megatron torch_dist or legacy):
    the HF side is then mapped to Megatron names, bit-exactly. Either may be a Hub repository
    (hf://ORG/NAME[@REVISION]): compared by headers and whole-file sha256, or byte for byte
    by range reads with --fetch.
    """

    def build() -> Report:
        return api.diff(
            a,
            b,
            all_tensors=all_tensors,
            dequantize=dequantize,
            fetch=fetch,
            trust_pickle=opts.trust_pickle,
            megatron_layout=megatron_layout,
            log=opts.log,
        )

    def ranked() -> RankRun:
        """The tensor list split across ranks (torch.distributed, gloo); rank 0 reports."""
        from mtpcheck.pipeline.distributed import diff_across_ranks

        return lambda on_rank0: diff_across_ranks(
            Path(a), Path(b), all_tensors, opts.trust_pickle, on_rank0, opts.log
        )

    report_and_exit("diff", build, opts, ranked)
