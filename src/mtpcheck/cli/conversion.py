"""``roundtrip`` (sharded under torchrun like ``diff``) and the built-in ``convert`` commands."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from mtpcheck import api
from mtpcheck.cli.app import (
    DEBUG,
    MEGATRON_LAYOUT,
    OutputOptions,
    RankRun,
    cli,
    output_options,
    report_and_exit,
    run_action,
)
from mtpcheck.cli.stderr_log import StderrLog
from mtpcheck.extras import require
from mtpcheck.model import Report, total_nbytes
from mtpcheck.units import human_size


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--to-megatron",
    metavar="CMD",
    help="Your HF->Megatron converter, e.g. 'python conv.py --in {src} --out {dst}'. "
    "Default: the built-in converter.",
)
@click.option(
    "--to-hf",
    metavar="CMD",
    help="Your Megatron->HF converter with {src} and {dst}. Default: built-in.",
)
@click.option(
    "--to-drafter",
    metavar="CMD",
    help="Instead of Megatron: a command taking the MTP layer out into a drafter format, with "
    "{src} and {dst} (speculators' 'speculators convert {src} --algorithm mtp ...').",
)
@click.option(
    "--from-drafter",
    metavar="CMD",
    help="With --to-drafter: the command writing that drafter back into the target, with "
    "{src} (the target), {drafter} and {dst} ('speculators stitch-mtp {drafter} {src} "
    "--output-path {dst}').",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where temporary checkpoints go (default: the system temp dir). Under torchrun "
    "across nodes it must be on a file system every node sees.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary checkpoints and say where.")
@click.option("--timeout", type=float, metavar="SECONDS", help="Time limit per converter command.")
@click.option(
    "--all",
    "all_tensors",
    is_flag=True,
    help="Compare every tensor of the final checkpoint, not only the MTP scope.",
)
@click.option(
    "--synthetic",
    is_flag=True,
    help="Round-trip a tiny random checkpoint built from PATH's config.json.",
)
@MEGATRON_LAYOUT
@output_options
def roundtrip(path: Path, opts: OutputOptions, **settings: Any) -> None:
    """HF -> Megatron -> HF through checkpoints on disk; MTP must survive bit for bit.

    With --to-drafter and --from-drafter: the MTP layer out into a drafter format and back
    into the target instead; the drafter is compared with the target's MTP layer.
    """
    from mtpcheck.pipeline.converter_command import validate_template

    via_drafter = settings["to_drafter"] is not None or settings["from_drafter"] is not None
    if via_drafter:
        _drafter_options(settings)
    else:
        # the main model's check reads Megatron names through megatron-core's config, with torch
        require("convert", "roundtrip")
    for option, template in (
        ("--to-megatron", settings["to_megatron"]),
        ("--to-hf", settings["to_hf"]),
        ("--to-drafter", settings["to_drafter"]),
    ):
        if template is not None:
            try:
                validate_template(template)
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint=option) from e

    def build() -> Report:
        return api.roundtrip(path, trust_pickle=opts.trust_pickle, log=opts.log, **settings)

    def ranked() -> RankRun:
        """Rank 0 converts; the comparisons are split across ranks; rank 0 reports."""
        from mtpcheck.pipeline.distributed import roundtrip_across_ranks
        from mtpcheck.pipeline.stages import RoundtripOptions

        options = RoundtripOptions(source=path, trust_pickle=opts.trust_pickle, **settings)
        return lambda on_rank0: roundtrip_across_ranks(options, opts.log, on_rank0)

    report_and_exit("roundtrip", build, opts, None if via_drafter else ranked)


def _drafter_options(settings: dict[str, Any]) -> None:
    """The drafter round trip's options, refused as a usage error where they clash."""
    from mtpcheck.pipeline.drafter_roundtrip import validate_options

    keys = ("to_drafter", "from_drafter", "to_megatron", "to_hf", "synthetic")
    try:
        validate_options(*(settings[k] for k in keys))
    except ValueError as e:
        raise click.UsageError(str(e)) from e


@cli.group()
def convert() -> None:
    """Built-in converters between HF safetensors and Megatron torch_dist."""


@convert.command("hf-to-megatron")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@DEBUG
def hf_to_megatron(src: Path, dst: Path, debug: bool) -> None:
    """Write SRC (HF safetensors) as a Megatron-LM torch_dist checkpoint at DST.

    SRC must pass `mtpcheck inspect` first: a source that fails it is refused (exit 1, the
    first failing finding named). Nothing is left at DST when the conversion fails or stops.
    """

    require("convert", "convert hf-to-megatron")

    def action() -> None:
        from mtpcheck.pipeline.gated_convert import hf_to_megatron as run

        log = StderrLog()
        started = time.monotonic()
        written, hf = run(src, dst, log)
        log(
            f"wrote {written} ({len(hf.tensors)} tensors, "
            f"{human_size(total_nbytes(hf.tensors))}) in "
            f"{time.monotonic() - started:.1f} s"
        )

    run_action(action, debug, "convert")


@convert.command("megatron-to-hf")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option(
    "--hf-config",
    type=click.Path(path_type=Path),
    required=True,
    help="config.json of the HF model the Megatron checkpoint holds, or the folder holding it "
    "(as roundtrip --synthetic takes).",
)
@click.option(
    "--copies/--no-copies",
    default=True,
    show_default=True,
    help="Re-create the MTP copies of embedding and head where the family stores them.",
)
@DEBUG
def megatron_to_hf(src: Path, dst: Path, hf_config: Path, copies: bool, debug: bool) -> None:
    """Write SRC (Megatron torch_dist or legacy) as HF sharded safetensors at DST.

    SRC must pass `mtpcheck inspect`, and the HF checkpoint it maps to must hold the MTP
    layers --hf-config declares; otherwise it is refused (exit 1). Nothing is left at DST when
    the conversion fails or stops.
    """

    require("convert", "convert megatron-to-hf")

    def action() -> None:
        from mtpcheck.formats.config_json import read_config
        from mtpcheck.pipeline.gated_convert import megatron_to_hf as run

        log = StderrLog()
        started = time.monotonic()
        config = hf_config / "config.json" if hf_config.is_dir() else hf_config
        files = run(src, dst, read_config(config), copies, False, log)
        size = sum(f.stat().st_size for f in files)
        log(
            f"wrote {dst} ({len(files)} safetensors file(s), {human_size(size)}) in "
            f"{time.monotonic() - started:.1f} s"
        )

    run_action(action, debug, "convert")
