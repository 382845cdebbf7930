"""``mtpcheck convert``: the built-in converters behind the audit, writing all or nothing.

A converter copies whatever it is given, so a source that already lost part of its MTP layer
would come out as a well-formed checkpoint that lost it too, with nothing to say so. Each
direction therefore runs ``inspect``'s checks on its source first, then checks its main model
against megatron-core's model of the config (:mod:`mtpcheck.pipeline.main_model`), and refuses
a source that fails either (:class:`~mtpcheck.errors.DamagedInput`, exit 1, naming the first
failing finding); Megatron -> HF also checks that the checkpoint it would write backs the MTP
count its config declares. What passes is written through :func:`fresh_output`: a failure or
an interrupt leaves no file behind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mtpcheck.checks.findings import failing_count, first_failure
from mtpcheck.checks.inspect_checks import count_check, inspect_report, layers_check
from mtpcheck.convert.builtin import require_empty_destination
from mtpcheck.errors import DamagedInput
from mtpcheck.families import analyse
from mtpcheck.model import Checkpoint, CheckResult
from mtpcheck.pipeline.main_model import mcore_model_check, megatron_mcore_model_check
from mtpcheck.pipeline.output_dir import fresh_output


def refuse_if_failing(
    path: str, checks: tuple[CheckResult, ...], what: str, inspect: bool = True
) -> None:
    """Raise :class:`DamagedInput` naming the first failing finding of ``checks`` (``inspect``:
    they are ``inspect``'s, which the message points to for the rest)."""
    failed = first_failure(checks)
    if failed is None:
        return
    check, finding = failed
    subject = "" if finding.subject == check.label else f"{finding.subject}: "
    failing = failing_count(checks)
    more = f"; {failing} failing findings in all" if failing > 1 else ""
    rest = f" (`mtpcheck inspect {path}` lists every finding)" if inspect else ""
    raise DamagedInput(
        path, f"not converted: {what}: {check.label}: {subject}{finding.message}{more}{rest}"
    )


def hf_to_megatron(src: Path, dst: Path, log: Callable[[str], None]) -> tuple[Path, Checkpoint]:
    """Convert the HF checkpoint at ``src`` into ``dst`` once it passes the audit; returns the
    written checkpoint folder (``dst/release``) and the source as opened."""
    from mtpcheck.convert import builtin
    from mtpcheck.formats import open_checkpoint

    require_empty_destination(dst)
    hf = open_checkpoint(src)
    refuse_if_failing(hf.path, inspect_report(hf).checks, "the source fails its audit")
    builtin.require_unquantized(hf)
    builtin.require_writable(hf, builtin.CONVERT_ELSEWHERE)
    refuse_if_failing(hf.path, (mcore_model_check(hf),), "the source is not whole", inspect=False)
    with fresh_output(dst) as partial:
        written = builtin.hf_to_megatron(hf, partial, log=log)
    return dst / written.relative_to(partial), hf


def megatron_to_hf(
    src: Path,
    dst: Path,
    hf_config: Mapping[str, Any],
    with_copies: bool,
    trust_pickle: bool,
    log: Callable[[str], None],
) -> list[Path]:
    """Convert the Megatron checkpoint at ``src`` into HF safetensors at ``dst`` once it passes
    the audit and the HF checkpoint it maps to backs ``hf_config``'s MTP count; returns the
    safetensors files written."""
    from mtpcheck.convert import builtin
    from mtpcheck.formats import open_checkpoint
    from mtpcheck.mapping import as_hf

    require_empty_destination(dst)
    megatron = open_checkpoint(src, trust_pickle)
    refuse_if_failing(megatron.path, inspect_report(megatron).checks, "the source fails its audit")
    whole = megatron_mcore_model_check(megatron, hf_config)
    refuse_if_failing(megatron.path, (whole,), "the source is not whole", inspect=False)
    view = as_hf(megatron, hf_config, with_copies)
    planned = analyse(view.config, view.tensors)
    refuse_if_failing(
        megatron.path,
        (count_check(planned), layers_check(planned)),
        "the HF checkpoint it would write does not back the config it would carry",
    )
    with fresh_output(dst) as partial:
        files = builtin.megatron_to_hf(megatron, partial, hf_config, with_copies, log=log)
    return [dst / f.relative_to(partial) for f in files]
