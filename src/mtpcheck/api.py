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
- :class:`~mtpcheck.errors.MtpcheckError`: the base class of all of them.

Heavy modules (torch, transformers) are imported only by the function that needs them:
:func:`inspect` and :func:`diff` never import torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mtpcheck.extras import require
from mtpcheck.layouts import MegatronLayout
from mtpcheck.model import Report
from mtpcheck.model.modes import DraftRule, OnlineEngine

if TYPE_CHECKING:
    from mtpcheck.accept.options import AcceptOptions, ServerOptions
    from mtpcheck.accept.vllm_engine import VllmSettings

Log = Callable[[str], None]
"""Where progress lines go (one line a call); the default drops them."""


def _silent(_line: str) -> None:
    """The default log: progress is dropped."""


def inspect(
    path: str | Path,
    *,
    draft: str | Path | None = None,
    target: str | Path | None = None,
    fetch: bool = False,
    trust_pickle: bool = False,
    log: Log = _silent,
) -> Report:
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
    from mtpcheck.checks.inspect_checks import inspect_report
    from mtpcheck.formats import open_input
    from mtpcheck.formats.tokenizer import token_table

    side = None if draft is None else str(draft)
    ckpt = open_input(str(path), trust_pickle, fetch, log, draft=side)
    if target is None:
        return inspect_report(ckpt)
    paired = open_input(str(target), trust_pickle, fetch, log)
    return inspect_report(ckpt, paired, (token_table(str(path)), token_table(str(target))))


def diff(
    a: str | Path,
    b: str | Path,
    *,
    all_tensors: bool = False,
    dequantize: bool = False,
    fetch: bool = False,
    trust_pickle: bool = False,
    megatron_layout: MegatronLayout = MegatronLayout.MEGATRON_CORE,
    log: Log = _silent,
) -> Report:
    """Compare ``b`` against ``a`` (``mtpcheck diff``): config keys, then the MTP tensors bit
    for bit (every tensor with ``all_tensors``).

    The two may be in different formats (HF safetensors, Megatron torch_dist or legacy, GGUF)
    or Hub repositories. ``dequantize`` measures tensors one side stores quantized against the
    other side's values; ``megatron_layout`` says whose modules a Megatron side was saved from.
    Raises :class:`~mtpcheck.errors.PathError` for an input that cannot be read.
    """
    from mtpcheck.checks.diff_checks import diff_report
    from mtpcheck.checks.drafter_report import extraction_diff
    from mtpcheck.checks.header_match import comparer_for
    from mtpcheck.checks.tensor_match import compare_many
    from mtpcheck.formats import open_input
    from mtpcheck.pipeline.progress import with_progress

    left = open_input(str(a), trust_pickle, fetch, log)
    right = open_input(str(b), trust_pickle, fetch, log)
    compare = comparer_for(left, right, with_progress(compare_many, "comparing", log))
    extracted = extraction_diff(left, right, compare)
    if extracted is not None:
        return extracted
    return diff_report(
        left,
        right,
        all_tensors=all_tensors,
        compare=compare,
        dequantize=dequantize,
        layout=megatron_layout,
    )


def roundtrip(
    path: str | Path,
    *,
    to_megatron: str | None = None,
    to_hf: str | None = None,
    to_drafter: str | None = None,
    from_drafter: str | None = None,
    workdir: Path | None = None,
    keep: bool = False,
    timeout: float | None = None,
    all_tensors: bool = False,
    synthetic: bool = False,
    trust_pickle: bool = False,
    megatron_layout: MegatronLayout = MegatronLayout.MEGATRON_CORE,
    log: Log = _silent,
) -> Report:
    """HF -> Megatron -> HF through checkpoints on disk (``mtpcheck roundtrip``); the MTP
    layers must survive bit for bit.

    ``to_megatron`` / ``to_hf``: your converter commands with ``{src}`` and ``{dst}`` (default:
    the built-in converters); ``timeout`` in seconds per command; ``synthetic`` round-trips a
    tiny random checkpoint built from ``path``'s config.json. ``to_drafter`` / ``from_drafter``
    instead take the MTP layer out into a drafter format (``{src}``, ``{dst}``) and write it
    back (``{src}``, ``{drafter}``, ``{dst}``), such as speculators' ``convert --algorithm
    mtp`` and ``stitch-mtp``; they need no ``convert`` extra. Raises
    :class:`~mtpcheck.extras.MissingExtra` without the ``convert`` extra, :class:`ValueError`
    for a converter command without its placeholders or options that do not go together.
    """
    from mtpcheck.pipeline.converter_command import validate_template
    from mtpcheck.pipeline.stages import RoundtripOptions

    via_drafter = to_drafter is not None or from_drafter is not None
    if via_drafter:
        from mtpcheck.pipeline.drafter_roundtrip import validate_options

        validate_options(to_drafter, from_drafter, to_megatron, to_hf, synthetic)
    else:
        require("convert", "roundtrip")
    for template in (to_megatron, to_hf, to_drafter):
        if template is not None:
            validate_template(template)
    options = RoundtripOptions(
        source=Path(path),
        to_megatron=to_megatron,
        to_hf=to_hf,
        to_drafter=to_drafter,
        from_drafter=from_drafter,
        workdir=workdir,
        keep=keep,
        timeout=timeout,
        all_tensors=all_tensors,
        synthetic=synthetic,
        trust_pickle=trust_pickle,
        megatron_layout=megatron_layout,
    )
    if via_drafter:
        from mtpcheck.pipeline.drafter_roundtrip import run_drafter_roundtrip

        return run_drafter_roundtrip(options, log=log)
    from mtpcheck.pipeline.roundtrip import run_roundtrip

    return run_roundtrip(options, log=log)


def accept(
    ckpt: str | Path | None,
    workloads: Mapping[str, str | Path] | Sequence[tuple[str, str | Path]],
    *,
    compare: Path | None = None,
    temperature: float = 1.0,
    device: str = "cpu",
    device_map: str | None = None,
    dtype: str = "auto",
    max_tokens: int = 512,
    tokenizer: Path | None = None,
    min_acceptance: float | None = None,
    trust_pickle: bool = False,
    online: bool = False,
    prompt_tokens: int = 9,
    new_tokens: int = 40,
    online_engine: OnlineEngine = OnlineEngine.MTPCHECK,
    depths: int | None = None,
    draft_rule: DraftRule = DraftRule.ENGINE,
    chain: str | None = None,
    engine: str | None = None,
    vllm: VllmSettings | None = None,
    teacher_forced: bool = False,
    server: ServerOptions | None = None,
    plot: Path | None = None,
    log: Log = _silent,
    drafter: Path | None = None,
) -> Report:
    """MTP acceptance per workload (``mtpcheck accept``): does the drafter earn its keep?

    ``workloads``: name -> JSONL or text file. The keywords are the CLI's options of the same
    names (docs/commands/accept.md); ``server`` measures on a running server instead, where
    ``ckpt`` may be None. ``drafter`` (with ``engine="vllm"``): vLLM drafts with that
    separate drafter folder instead of the checkpoint's MTP layers. ``plot`` also writes a PNG
    chart. Raises
    :class:`~mtpcheck.errors.DamagedInput` for a checkpoint whose main model is not whole,
    :class:`~mtpcheck.errors.PathError` for an unreadable input,
    :class:`~mtpcheck.extras.MissingExtra` without the ``accept`` (``plot``) extra.
    """
    from mtpcheck.accept.options import AcceptOptions
    from mtpcheck.accept.vllm_engine import VllmSettings

    named = workloads.items() if isinstance(workloads, Mapping) else workloads
    options = AcceptOptions(
        checkpoint=None if ckpt is None else Path(ckpt),
        workloads=tuple((name, Path(file)) for name, file in named),
        compare=compare,
        temperature=temperature,
        device=device,
        device_map=device_map,
        dtype=dtype,
        max_tokens=max_tokens,
        tokenizer=tokenizer,
        min_acceptance=min_acceptance,
        trust_pickle=trust_pickle,
        online=online,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        online_engine=OnlineEngine(online_engine),
        depths=depths,
        draft_rule=DraftRule(draft_rule),
        chain=chain,
        engine=engine,
        vllm=vllm or VllmSettings(),
        teacher_forced=teacher_forced,
        server=server,
        drafter=None if drafter is None else Path(drafter),
    )
    if options.server is not None:
        return _on_server(options, options.server, log)
    return _offline(options, plot, log)


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
    if options.checkpoint is None:
        raise ValueError("accept needs a checkpoint unless it measures on a server")
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


__all__ = ["Log", "accept", "diff", "inspect", "roundtrip"]
