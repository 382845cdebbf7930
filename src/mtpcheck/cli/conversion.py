"""``roundtrip`` (sharded under torchrun like ``diff``) and the built-in ``convert`` commands."""

from __future__ import annotations

import time
from typing import Any

from mtpcheck import api
from mtpcheck.cli.app import (
    DEBUG,
    OutputOptions,
    RankRun,
    cli,
    output_options,
    report_and_exit,
    run_action,
)
from mtpcheck.cli.declared import built, declared_parameters
from mtpcheck.cli.stderr_log import StderrLog
from mtpcheck.extras import require
from mtpcheck.pipeline.options import HfToMegatronOptions, MegatronToHfOptions, RoundtripOptions
from mtpcheck.units import human_size


@cli.command()
@declared_parameters(RoundtripOptions)
@output_options
def roundtrip(opts: OutputOptions, **params: Any) -> None:
    """HF -> Megatron -> HF through checkpoints on disk; MTP must survive bit for bit.

    With --to-drafter and --from-drafter: the MTP layer out into a drafter format and back
    into the target instead; the drafter is compared with the target's MTP layer.
    """
    options = built(RoundtripOptions, params, opts)
    if not options.via_drafter:
        # the main model's check reads Megatron names through megatron-core's config, with torch
        require("convert", "roundtrip")

    def ranked() -> RankRun:
        """Rank 0 converts; the comparisons are split across ranks; rank 0 reports."""
        from mtpcheck.pipeline.distributed import roundtrip_across_ranks

        return lambda on_rank0: roundtrip_across_ranks(options, opts.log, on_rank0)

    build = lambda: api.roundtrip_with(options)  # noqa: E731
    report_and_exit("roundtrip", build, opts, None if options.via_drafter else ranked)


@cli.group()
def convert() -> None:
    """Built-in converters between HF safetensors and Megatron torch_dist."""


@convert.command("hf-to-megatron")
@declared_parameters(HfToMegatronOptions)
@DEBUG
def hf_to_megatron(debug: bool, **params: Any) -> None:
    """Write SRC (HF safetensors) as a Megatron-LM torch_dist checkpoint at DST.

    SRC must pass `mtpcheck inspect` first: a source that fails it is refused (exit 1, the
    first failing finding named). Nothing is left at DST when the conversion fails or stops.
    """
    log = StderrLog()
    options = HfToMegatronOptions(**params, log=log)
    require("convert", "convert hf-to-megatron")

    def action() -> None:
        started = time.monotonic()
        written = api.convert_hf_to_megatron_with(options)
        log(
            f"wrote {written.path} ({written.files} tensors, {human_size(written.nbytes)}) in "
            f"{time.monotonic() - started:.1f} s"
        )

    run_action(action, debug, "convert")


@convert.command("megatron-to-hf")
@declared_parameters(MegatronToHfOptions)
@DEBUG
def megatron_to_hf(debug: bool, **params: Any) -> None:
    """Write SRC (Megatron torch_dist or legacy) as HF sharded safetensors at DST.

    SRC must pass `mtpcheck inspect`, and the HF checkpoint it maps to must hold the MTP
    layers --hf-config declares; otherwise it is refused (exit 1). Nothing is left at DST when
    the conversion fails or stops.
    """
    log = StderrLog()
    options = MegatronToHfOptions(**params, log=log)
    require("convert", "convert megatron-to-hf")

    def action() -> None:
        started = time.monotonic()
        written = api.convert_megatron_to_hf_with(options)
        log(
            f"wrote {written.path} ({written.files} safetensors file(s), "
            f"{human_size(written.nbytes)}) in {time.monotonic() - started:.1f} s"
        )

    run_action(action, debug, "convert")
