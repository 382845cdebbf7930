"""``inspect`` and ``diff``, and the torchrun plumbing ``diff`` and ``roundtrip`` share."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import click

from mtpcheck.cli.app import (
    MEGATRON_LAYOUT,
    OutputOptions,
    cli,
    execute,
    make_options,
    output_options,
)
from mtpcheck.errors import ExitCode
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
@output_options
def inspect(
    path: str,
    fetch: bool,
    draft: str | None,
    fmt: str,
    junit_xml: Path | None,
    markdown: Path | None,
    debug: bool,
    trust_pickle: bool,
    quiet: bool,
) -> None:
    """Audit one checkpoint: MTP family, declared count, layers present, shared copies.

    PATH is a local checkpoint, or a Hugging Face Hub repository (hf://ORG/NAME[@REVISION])
    audited by its headers without downloading weights.
    """

    def build() -> Report:
        from mtpcheck.checks.inspect_checks import inspect_report
        from mtpcheck.formats import open_input

        if draft is not None:
            from mtpcheck.formats.gguf import open_target_and_draft

            return inspect_report(open_target_and_draft(Path(path), Path(draft)))
        return inspect_report(open_input(path, trust_pickle, fetch, opts.log))

    opts = make_options(fmt, junit_xml, markdown, debug, trust_pickle, quiet)
    raise SystemExit(execute("inspect", build, opts))


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
    fmt: str,
    junit_xml: Path | None,
    markdown: Path | None,
    debug: bool,
    trust_pickle: bool,
    quiet: bool,
) -> None:
    """Compare B against A: config keys, then MTP tensors bit for bit (all with --all).

    A and B may be in different formats (HF safetensors, Megatron torch_dist or legacy):
    the HF side is then mapped to Megatron names, bit-exactly. Either may be a Hub repository
    (hf://ORG/NAME[@REVISION]): compared by headers and whole-file sha256, or byte for byte
    by range reads with --fetch.
    """

    def build() -> Report:
        from mtpcheck.checks.diff_checks import diff_report
        from mtpcheck.checks.header_match import (
            compare_by_headers,
            needs_headers_only,
            proven_first,
        )
        from mtpcheck.checks.tensor_match import compare_many
        from mtpcheck.formats import open_input
        from mtpcheck.model import HeadersOnly
        from mtpcheck.pipeline.progress import with_progress

        left = open_input(a, trust_pickle, fetch, opts.log)
        right = open_input(b, trust_pickle, fetch, opts.log)
        compare = with_progress(compare_many, "comparing", opts.log)
        if needs_headers_only(left, right):
            compare = compare_by_headers
        elif isinstance(left, HeadersOnly) or isinstance(right, HeadersOnly):
            compare = proven_first(compare)  # --fetch: hashes first, bytes for the rest
        return diff_report(
            left,
            right,
            all_tensors=all_tensors,
            compare=compare,
            dequantize=dequantize,
            layout=megatron_layout,
        )

    opts = make_options(fmt, junit_xml, markdown, debug, trust_pickle, quiet)
    if under_torchrun():
        exit_rank(_diff_across_ranks(Path(a), Path(b), all_tensors, opts))
    raise SystemExit(execute("diff", build, opts))


def exit_rank(code: int) -> NoReturn:
    """End a torchrun rank once its work is done, flushed and its process group destroyed,
    without the interpreter's teardown: there libtorch's gloo and store threads can hit
    ``std::terminate`` in static destructors on a loaded machine (SIGABRT, "terminate called
    without an active exception"), turning a finished run into a failed rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


def under_torchrun() -> bool:
    """``WORLD_SIZE`` > 1: started by torchrun (see benchmarks/README.md, cluster scale)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def across_ranks(
    command: str, opts: OutputOptions, run: Callable[[Callable[[Callable[[], Report]], int]], int]
) -> int:
    """``run`` one rank of a torchrun job with rank 0's ``execute``; its common exit code."""

    def on_rank0(build: Callable[[], Report]) -> int:
        return execute(command, build, opts)

    try:
        return run(on_rank0)
    except Exception as e:  # the process group itself failed (rendezvous, timeout)
        click.echo(f"mtpcheck: error: torch.distributed: {type(e).__name__}: {e}", err=True)
        return ExitCode.INTERNAL


def _diff_across_ranks(a: Path, b: Path, all_tensors: bool, opts: OutputOptions) -> int:
    """The tensor list split across ranks (torch.distributed, gloo); rank 0 reports."""
    from mtpcheck.pipeline.distributed import diff_across_ranks

    return across_ranks(
        "diff",
        opts,
        lambda on_rank0: diff_across_ranks(
            a, b, all_tensors, opts.trust_pickle, on_rank0, opts.log
        ),
    )
