"""The Python API: each command of the CLI as a function that returns the typed report.

The CLI (:mod:`mtpcheck.cli`) parses options and calls these; a converter's own tests can call
them directly (see also :mod:`mtpcheck.testing`). Every function returns a
:class:`~mtpcheck.model.Report` whose ``ok`` is the verdict (``mtpcheck``'s exit 0 or 1) and
raises, for what ends the CLI with exit 2 or refuses a checkpoint:

- :class:`~mtpcheck.errors.PathError` (and its kinds, e.g. ``InputError``): an input that is
  unreadable or malformed, named with its path;
- :class:`~mtpcheck.errors.DamagedInput`: a checkpoint refused for a defect a command will
  not work from (the CLI's exit 1, "refused");
- :class:`~mtpcheck.extras.MissingExtra`: a command whose optional packages are not installed;
- :class:`UsageError`: options that do not go together, or a value out of its range, in the
  very words the CLI uses before it exits 2;
- :class:`~mtpcheck.errors.MtpcheckError`: the base class of all of them.

Each function's parameters are the fields of its command's options dataclass
(:class:`InspectOptions`, :class:`DiffOptions`, :class:`RoundtripOptions`,
:class:`AcceptOptions`, ...), where each option is declared once for the CLI, the API and the
docs; the ``*_with`` twins take that dataclass itself.

Heavy modules (torch, transformers) are imported only by the function that needs them:
:func:`inspect` and :func:`diff` never import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from inspect import signature
from pathlib import Path
from typing import ParamSpec, TypeVar

from mtpcheck.accept.options import AcceptOptions, ServerOptions
from mtpcheck.checks.options import DiffOptions, InspectOptions
from mtpcheck.declared import Options, UsageError
from mtpcheck.extras import require
from mtpcheck.model import Report
from mtpcheck.pipeline.options import HfToMegatronOptions, MegatronToHfOptions, RoundtripOptions

Log = Callable[[str], None]
"""Where progress lines go (one line a call); the default drops them."""

P = ParamSpec("P")
OptionsT = TypeVar("OptionsT", bound=Options)
R = TypeVar("R")


def taking(
    options: Callable[P, OptionsT], run: Callable[[OptionsT], R], name: str
) -> Callable[P, R]:
    """The command ``run`` with ``options``' fields as its parameters: it builds the options
    dataclass from them and runs. Its signature, for a type checker and for ``help()``, is the
    dataclass's own, so each option is declared once; ``run`` validates what it is given
    (:class:`~mtpcheck.declared.UsageError` for what the CLI refuses)."""

    def command(*args: P.args, **kwargs: P.kwargs) -> R:
        return run(options(*args, **kwargs))

    command.__name__ = command.__qualname__ = name
    fields_of = getattr(options, "__name__", "its options")
    command.__doc__ = f"{run.__doc__}\n\n    Its parameters are :class:`{fields_of}`'s fields."
    command.__module__ = run.__module__
    returns = signature(run).return_annotation
    command.__signature__ = signature(options).replace(  # type: ignore[attr-defined]
        return_annotation=returns
    )
    return command


def inspect_with(options: InspectOptions) -> Report:
    """Audit one checkpoint (``mtpcheck inspect``): MTP family, declared count, layers
    present, shared copies; or a drafter that ships beside its target, against its own config
    and, with ``target``, against that target (its kind, taps, vocabulary maps, widths,
    embedding and head, an extracted MTP layer bit for bit).

    ``path`` is a local checkpoint or a Hub repository (``hf://ORG/NAME[@REVISION]``, read by
    its headers; ``fetch`` reads tensor bytes by HTTP range). ``draft``: the MTP draft GGUF
    split off a GGUF target, audited with it as one model. ``target``: the model a drafter is
    served with (local or Hub); :class:`~mtpcheck.errors.InputError` when ``path`` is not a
    drafter. ``trust_pickle`` unpickles Megatron files without the allowlist (only for files
    you vouch for). Raises :class:`~mtpcheck.errors.PathError` for an input that cannot be
    read.
    """
    options.validate()
    from mtpcheck.checks.inspect_checks import inspect_report
    from mtpcheck.formats import open_input
    from mtpcheck.formats.tokenizer import token_table

    o = options
    path, draft = str(o.path), None if o.draft is None else str(o.draft)
    ckpt = open_input(path, o.trust_pickle, o.fetch, o.log, draft=draft)
    if o.target is None:
        return inspect_report(ckpt)
    target = str(o.target)
    paired = open_input(target, o.trust_pickle, o.fetch, o.log)
    return inspect_report(ckpt, paired, (token_table(path), token_table(target)))


inspect = taking(InspectOptions, inspect_with, "inspect")


def diff_with(options: DiffOptions) -> Report:
    """Compare ``b`` against ``a`` (``mtpcheck diff``): config keys, then the MTP tensors bit
    for bit (every tensor with ``all_tensors``).

    The two may be in different formats (HF safetensors, Megatron torch_dist or legacy, GGUF)
    or Hub repositories. ``dequantize`` measures tensors one side stores quantized against the
    other side's values; ``megatron_layout`` says whose modules a Megatron side was saved from.
    Raises :class:`~mtpcheck.errors.PathError` for an input that cannot be read.
    """
    options.validate()
    from mtpcheck.checks.diff_checks import diff_report
    from mtpcheck.checks.drafter_report import extraction_diff
    from mtpcheck.checks.header_match import comparer_for
    from mtpcheck.checks.tensor_match import compare_many
    from mtpcheck.formats import open_input
    from mtpcheck.pipeline.progress import with_progress

    o = options
    left = open_input(str(o.a), o.trust_pickle, o.fetch, o.log)
    right = open_input(str(o.b), o.trust_pickle, o.fetch, o.log)
    compare = comparer_for(left, right, with_progress(compare_many, "comparing", o.log))
    extracted = extraction_diff(left, right, compare)
    if extracted is not None:
        return extracted
    return diff_report(
        left,
        right,
        all_tensors=o.all_tensors,
        compare=compare,
        dequantize=o.dequantize,
        layout=o.megatron_layout,
    )


diff = taking(DiffOptions, diff_with, "diff")


def roundtrip_with(options: RoundtripOptions) -> Report:
    """HF -> Megatron -> HF through checkpoints on disk (``mtpcheck roundtrip``); the MTP
    layers must survive bit for bit.

    ``to_megatron`` / ``to_hf``: your converter commands with ``{src}`` and ``{dst}`` (default:
    the built-in converters); ``timeout`` in seconds per command; ``synthetic`` round-trips a
    tiny random checkpoint built from ``source``'s config.json. ``to_drafter`` /
    ``from_drafter`` instead take the MTP layer out into a drafter format (``{src}``,
    ``{dst}``) and write it back (``{src}``, ``{drafter}``, ``{dst}``), such as speculators'
    ``convert --algorithm mtp`` and ``stitch-mtp``; they need no ``convert`` extra. Raises
    :class:`~mtpcheck.extras.MissingExtra` without the ``convert`` extra.
    """
    options.validate()
    if options.via_drafter:
        from mtpcheck.pipeline.drafter_roundtrip import run_drafter_roundtrip

        return run_drafter_roundtrip(options, log=options.log)
    # the main model's check reads Megatron names through megatron-core's config, with torch
    require("convert", "roundtrip")
    from mtpcheck.pipeline.roundtrip import run_roundtrip

    return run_roundtrip(options, log=options.log)


roundtrip = taking(RoundtripOptions, roundtrip_with, "roundtrip")


def accept_with(options: AcceptOptions) -> Report:
    """MTP acceptance per workload (``mtpcheck accept``): does the drafter earn its keep?

    ``workloads``: (name, JSONL or text file) pairs. The keywords are the CLI's options of the
    same names (docs/commands/accept.md); ``server_url`` measures on a running server instead,
    where ``checkpoint`` may be None. ``drafter`` (with ``engine="vllm"``): vLLM drafts with
    that separate drafter folder instead of the checkpoint's MTP layers. ``plot`` also writes
    a PNG chart. Raises
    :class:`~mtpcheck.errors.DamagedInput` for a checkpoint whose main model is not whole,
    :class:`~mtpcheck.errors.PathError` for an unreadable input,
    :class:`~mtpcheck.extras.MissingExtra` without the ``accept`` (``plot``) extra.
    """
    options.validate()
    if options.server is not None:
        return _on_server(options, options.server, options.log)
    return _offline(options, options.plot, options.log)


accept = taking(AcceptOptions, accept_with, "accept")


@dataclass(frozen=True)
class Written:
    """What a built-in conversion wrote."""

    path: Path
    """The checkpoint folder written."""
    files: int
    nbytes: int


def convert_hf_to_megatron_with(options: HfToMegatronOptions) -> Written:
    """Write ``src`` (HF safetensors) as a Megatron-LM torch_dist checkpoint at ``dst``
    (``mtpcheck convert hf-to-megatron``). The source must pass ``inspect`` first
    (:class:`~mtpcheck.errors.DamagedInput` naming its first failing finding); nothing is left
    at ``dst`` when the conversion fails or stops."""
    options.validate()
    require("convert", "convert hf-to-megatron")
    from mtpcheck.model import total_nbytes
    from mtpcheck.pipeline.gated_convert import hf_to_megatron

    written, hf = hf_to_megatron(options.src, options.dst, options.log)
    return Written(written, len(hf.tensors), total_nbytes(hf.tensors))


convert_hf_to_megatron = taking(
    HfToMegatronOptions, convert_hf_to_megatron_with, "convert_hf_to_megatron"
)


def convert_megatron_to_hf_with(options: MegatronToHfOptions) -> Written:
    """Write ``src`` (Megatron torch_dist or legacy) as HF sharded safetensors at ``dst``
    (``mtpcheck convert megatron-to-hf``). The source must pass ``inspect``, and the HF
    checkpoint it maps to must hold the MTP layers ``hf_config`` declares
    (:class:`~mtpcheck.errors.DamagedInput`); nothing is left at ``dst`` when it fails."""
    options.validate()
    require("convert", "convert megatron-to-hf")
    from mtpcheck.formats.config_json import read_config
    from mtpcheck.pipeline.gated_convert import megatron_to_hf

    o = options
    config = read_config(o.config_file)
    files = megatron_to_hf(o.src, o.dst, config, o.copies, o.trust_pickle, o.log)
    return Written(o.dst, len(files), sum(f.stat().st_size for f in files))


convert_megatron_to_hf = taking(
    MegatronToHfOptions, convert_megatron_to_hf_with, "convert_megatron_to_hf"
)


def _whole_checkpoints(options: AcceptOptions, checkpoints: list[Path]) -> None:
    """Every workload reads and every checkpoint opens with its main model whole (else
    :class:`~mtpcheck.errors.DamagedInput`), before anything is measured."""
    from mtpcheck.accept.preflight import preflight
    from mtpcheck.pipeline.whole_source import require_whole_main_model

    workload_files = [file for _, file in options.workloads]
    for checkpoint in preflight(checkpoints, workload_files, options.trust_pickle):
        require_whole_main_model(checkpoint)


def _offline(options: AcceptOptions, plot: Path | None, log: Log) -> Report:
    """Measure on the checkpoint itself (teacher-forced, ``online``, or on vLLM)."""
    require("accept", "accept on a checkpoint")
    if plot is not None:
        require("plot", "accept --plot")
    assert options.checkpoint is not None  # AcceptOptions.validate refuses it otherwise
    checkpoints = [options.checkpoint]
    if options.compare is not None:
        checkpoints.append(options.compare)
    _whole_checkpoints(options, checkpoints)
    from mtpcheck.accept.runner import run_accept

    report = run_accept(options, log=log)
    if plot is not None:
        from mtpcheck.accept.plot import write_plot

        write_plot(report, plot)
    return report


def _on_server(options: AcceptOptions, server: ServerOptions, log: Log) -> Report:
    """Check the inputs (the checkpoint, if any, opens whole; workloads read), then measure on
    the running server."""
    if options.checkpoint is not None:
        require("accept", "accept --server with CKPT (its offline expectation)")
        _whole_checkpoints(options, [options.checkpoint])
    from mtpcheck.accept.server_runner import run_server_accept

    return run_server_accept(options, server, log)


__all__ = [
    "AcceptOptions",
    "accept_with",
    "convert_hf_to_megatron_with",
    "convert_megatron_to_hf_with",
    "diff_with",
    "inspect_with",
    "roundtrip_with",
    "DiffOptions",
    "HfToMegatronOptions",
    "InspectOptions",
    "Log",
    "MegatronToHfOptions",
    "RoundtripOptions",
    "ServerOptions",
    "UsageError",
    "Written",
    "accept",
    "convert_hf_to_megatron",
    "convert_megatron_to_hf",
    "diff",
    "inspect",
    "roundtrip",
]
