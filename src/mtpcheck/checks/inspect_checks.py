"""Checks of one checkpoint: MTP family, declared count, layer completeness, shared copies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from mtpcheck.checks.drafter_checks import unknown_kind_check
from mtpcheck.checks.drafter_report import drafter_report
from mtpcheck.checks.dspark_inside import dspark_count_check, without_mtp_layers
from mtpcheck.checks.findings import describe, integrity_check, status_of
from mtpcheck.checks.header_match import compare_by_headers, comparer_for
from mtpcheck.checks.main_model_checks import main_model_check
from mtpcheck.checks.quant_checks import quantization_check
from mtpcheck.checks.quant_pairs import quantized_copy
from mtpcheck.checks.serving_checks import serving_check
from mtpcheck.checks.shape_checks import shapes_check
from mtpcheck.checks.tensor_match import compare, compare_many
from mtpcheck.checks.trained_checks import trained_check
from mtpcheck.errors import InputError
from mtpcheck.families import ConcatOrder, CopyPolicy, Drafter, MtpAnalysis, analyse, summarise
from mtpcheck.families.drafters import dspark_inside, recognise, unknown_drafter
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckResult,
    Finding,
    HeadersOnly,
    MtpLayerReport,
    RecordsWriter,
    Report,
    Status,
    TensorStatus,
)
from mtpcheck.model.checkpoint import DraftsBeside
from mtpcheck.params import declared_scheme
from mtpcheck.units import first_few
from mtpcheck.writers import writer_of


def family_check(analysis: MtpAnalysis) -> CheckResult:
    """Which MTP family the config names, and how its drafter is shaped."""
    if analysis.family is not None:
        f = analysis.family
        if f.drafter is Drafter.SEPARATE:
            shape = "no MTP layers inside; its drafter ships as a separate checkpoint"
        elif f.drafter is Drafter.IS_DRAFTER:
            shape = "a separate drafter checkpoint, not MTP layers inside a model"
        elif f.layout.concat_order is ConcatOrder.SPLIT:
            shape = "embedding and hidden state projected apart, then summed"
        else:
            shape = f"projection concat {f.layout.concat_order.value}"
        model_type = analysis.model_type or "absent"
        finding = Finding(f.key, Status.PASS, f"{f.display} (model_type {model_type}, {shape})")
    else:
        if analysis.declared.source == "no config.json":
            subject, what = "config.json", "no config.json, so no model_type"
        elif analysis.model_type is None:
            subject, what = "model_type", "config.json names no model_type"
        else:
            subject, what = analysis.model_type, f"unknown model_type {analysis.model_type!r}"
        finding = Finding(
            subject,
            Status.WARN,
            f"{what}: MTP tensors located by name heuristics (layers >= num_hidden_layers, "
            "'mtp', 'nextn', 'eh_proj'); layer completeness not checked",
        )
    return CheckResult(CheckName.FAMILY, "MTP family", (finding,))


def count_check(analysis: MtpAnalysis) -> CheckResult:
    """Declared count must equal the number of complete MTP layers present."""
    declared = analysis.declared
    found = sum(1 for layer in analysis.layers if layer.present)
    complete = analysis.complete_layers
    d = declared.value
    src = declared.source
    drafter = analysis.family.drafter if analysis.family else Drafter.INSIDE
    if drafter is not Drafter.INSIDE and found == 0 and not d:
        what = (
            "the drafter ships as a separate checkpoint"
            if drafter is Drafter.SEPARATE
            else "this checkpoint is itself the drafter"
        )
        finding = Finding("mtp-count", Status.PASS, f"no MTP layers expected: {what}")
    elif d is None or d == 0:
        if found == 0:
            what = "no MTP layers declared" if d is None else "config declares 0 MTP layers"
            finding = Finding("mtp-count", Status.PASS, f"{what} ({src}); none present")
        elif d is None and analysis.family is not None and analysis.family.count.from_command_line:
            # the loader is told the count on its command line, so the weights are not lost,
            # only unlabelled
            finding = Finding(
                "mtp-count",
                Status.WARN,
                f"{found} MTP layer(s) present ({complete} complete) but the checkpoint records "
                f"no MTP count ({src}); load it with --mtp-num-layers {found}",
            )
        else:
            said = f"config declares 0 ({src})" if d == 0 else f"undeclared ({src})"
            finding = Finding(
                "mtp-count",
                Status.FAIL,
                f"{found} MTP layer(s) present but {said}; serving engines read the count "
                "key and will not load them",
            )
    elif found == 0:
        finding = Finding(
            "mtp-count",
            Status.FAIL,
            f"config declares {d} MTP layer(s) ({src}) but the checkpoint holds no MTP weights",
        )
    elif complete == d and found == d:
        said = "declared" if declared.from_key else "assumed"
        finding = Finding("mtp-count", Status.PASS, f"{d} {said} ({src}); {d} present, complete")
    else:
        why = "; ".join(_why_incomplete(x) for x in analysis.layers if x.present and not x.complete)
        finding = Finding(
            "mtp-count",
            Status.FAIL,
            f"config declares {d} ({src}); {found} present, {complete} complete"
            + (f" ({why})" if why else ""),
        )
    details = {"declared": d, "declared_by": src, "present": found, "complete": complete}
    return CheckResult(
        CheckName.MTP_COUNT, "Declared vs present MTP layers", (_with(finding, details),)
    )


def _why_incomplete(layer: MtpLayerReport) -> str:
    parts = [f"lacks {first_few(layer.missing, 2, counted=False)}"] if layer.missing else []
    if layer.unreadable:
        parts.append(f"has {len(layer.unreadable)} unreadable")
    return f"mtp layer {layer.index} " + " and ".join(parts)


def _with(f: Finding, details: Mapping[str, object]) -> Finding:
    return Finding(f.subject, f.status, f.message, details)


def layers_check(analysis: MtpAnalysis) -> CheckResult:
    """Each MTP layer present: complete, or what it lacks."""
    findings = []
    judged = analysis.family is not None
    for layer in analysis.layers:
        subject = f"mtp layer {layer.index}"
        where = layer.prefix or "by name heuristics"
        size = f"{len(layer.present)} tensors, {layer.nbytes} bytes, {'/'.join(layer.dtypes)}"
        details = {
            "prefix": layer.prefix,
            "present": len(layer.present),
            "missing": list(layer.missing),
        }
        if not judged:
            findings.append(Finding(subject, Status.INFO, f"{where}: {size}", details))
        elif layer.complete:
            ref = analysis.reference_layers.get(layer.index)
            against = f"; block matches {ref}*" if ref else ""
            findings.append(
                Finding(subject, Status.PASS, f"{where}: complete, {size}{against}", details)
            )
        else:
            total = len(layer.present) + len(layer.missing)
            parts = []
            if layer.missing:
                missing = first_few(layer.missing, 4, counted=False)
                parts.append(f"{len(layer.missing)} of {total} tensors missing: {missing}")
            if layer.unreadable:
                parts.append(
                    f"{len(layer.unreadable)} of {total} tensors unreadable (their bytes are cut "
                    f"off): {first_few(layer.unreadable, 4, counted=False)}"
                )
            details = {**details, "unreadable": list(layer.unreadable)}
            findings.append(Finding(subject, Status.FAIL, f"{where}: {'; '.join(parts)}", details))
    findings += [
        Finding(
            name,
            Status.FAIL,
            "missing: the MTP layers draft through this main tensor"
            + (
                ""
                if name == analysis.family.layout.main_shared[0]
                else " (the config does not tie it to the embedding)"
            ),
        )
        for name in analysis.shared_missing
        if analysis.family is not None
    ]
    if not findings:
        findings.append(Finding("mtp layers", Status.SKIP, "no MTP layers present"))
    return CheckResult(CheckName.MTP_LAYERS, "MTP layer completeness", tuple(findings))


def copies_check(ckpt: Checkpoint, analysis: MtpAnalysis) -> CheckResult:
    """Stored MTP copies of main tensors must equal them bit for bit."""
    findings = []
    no_bytes = ckpt.why_no_bytes if isinstance(ckpt, HeadersOnly) else ""
    scheme = declared_scheme(ckpt)
    for copy, main in analysis.copies:
        quantized = quantized_copy(ckpt.tensors, main, copy, scheme)
        if quantized is not None:
            findings.append(Finding(copy, Status.INFO, quantized))
            continue
        if no_bytes:
            c = compare_by_headers(ckpt, ckpt, [(main, copy)])[0]
            if c.status is TensorStatus.NOT_COMPARED:
                findings.append(Finding(copy, Status.SKIP, f"not compared with {main}: {no_bytes}"))
                continue
        else:
            c = compare(ckpt, main, ckpt, copy)
        if c.status is TensorStatus.EQUAL:
            findings.append(
                Finding(copy, Status.PASS, f"bit-identical to {main} ({c.nbytes} bytes)")
            )
        elif c.status is TensorStatus.EXTRA:
            findings.append(Finding(copy, Status.WARN, f"{main} is absent; nothing to compare to"))
        elif c.status is TensorStatus.UNREADABLE:
            cut = [n for n in (main, copy) if not ckpt.tensors[n].readable]
            findings.append(
                Finding(
                    copy,
                    Status.FAIL,
                    f"not compared with {main}: the bytes of {' and '.join(cut)} are cut off "
                    "(file truncated)",
                )
            )
        elif status_of(c) is Status.WARN:  # every value kept in another float type
            findings.append(Finding(copy, Status.WARN, f"holds {main}'s values: {describe(c)}"))
        else:
            findings.append(
                Finding(copy, Status.FAIL, f"diverged from {main}: {describe(c, main, copy)}")
            )
    if not findings:
        family = analysis.family
        if family is not None and family.layout.head_output and not family.layout.copies:
            reason = (
                "family stores no MTP copies; each MTP layer holds its own output head (not a "
                "copy) and reuses the main embedding"
            )
        elif (
            family is None
            or not family.layout.copies
            or family.layout.copy_policy is CopyPolicy.NONE
        ):
            reason = "family stores no MTP copies; the MTP layer reuses the main embedding and head"
        elif family.layout.copy_policy is CopyPolicy.REQUIRED:
            reason = "no copies present (reported under mtp-layers)"
        else:
            reason = f"no copies stored (allowed for {family.display})"
        findings.append(Finding("shared copies", Status.SKIP, reason))
    return CheckResult(CheckName.SHARED_COPIES, "MTP copies of embedding and head", tuple(findings))


def _with_draft_note(check: CheckResult, ckpt: Checkpoint, analysis: MtpAnalysis) -> CheckResult:
    """A GGUF file without a nextn layer: where its draft, if one was split off, would be."""
    drafts = ckpt.drafts_beside if isinstance(ckpt, DraftsBeside) else None
    if analysis.declared.value or drafts is None:
        return check
    if drafts:
        found = ", ".join(drafts)
        message = f"no nextn layer in this file; {found} beside it: check the pair with --draft"
    else:
        message = (
            "no nextn layer in this file; llama.cpp's --mtp writes a split-off MTP head to "
            "mtp-<name>.gguf, and none is beside it"
        )
    return replace(check, findings=(*check.findings, Finding("draft", Status.INFO, message)))


def _with_writer_note(check: CheckResult, ckpt: Checkpoint, analysis: MtpAnalysis) -> CheckResult:
    """An MTP layer declared and absent in the output of a tool known to drop it: the tool's
    behaviour, named."""
    written = ckpt.written_as if isinstance(ckpt, RecordsWriter) else frozenset()
    writer = writer_of(written)
    if writer is None or not analysis.declared.value or analysis.mtp_names:
        return check
    note = Finding(
        "writer",
        Status.INFO,
        f"written by {writer.name} (safetensors metadata format {writer.metadata_format!r}), "
        f"which {writer.mtp}",
    )
    return replace(check, findings=(*check.findings, note))


def inspect_report(
    ckpt: Checkpoint,
    target: Checkpoint | None = None,
    tokenizers: tuple[str | None, str | None] = (None, None),
) -> Report:
    """Build the inspect report of one checkpoint; of a drafter that ships beside its target,
    against ``target`` where given (:class:`~mtpcheck.errors.InputError` when ``ckpt`` is no
    drafter). ``tokenizers``: digests of the two sides' token tables, where each ships one."""
    kind = recognise(ckpt.config, ckpt.tensors)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    compare = comparer_for(ckpt, target or ckpt, compare_many)
    if kind is not None and (analysis.family is None or kind.mtp_extract):
        # an extracted MTP layer keeps its target's model_type; the model checks do not apply
        return drafter_report(ckpt, kind, compare, target, tokenizers=tokenizers)
    seen = unknown_drafter(ckpt.config) if kind is None and analysis.family is None else None
    if seen is not None:
        alone = (integrity_check([("", ckpt)]), unknown_kind_check(seen))
        return Report(command="inspect", inputs=(summarise(ckpt, analysis),), checks=alone)
    if target is not None and kind is None:
        raise InputError(
            ckpt.path,
            "--target: this is not a drafter that ships beside its target (model_type "
            f"{analysis.model_type!r}); it is audited alone",
        )
    dspark = dspark_inside(ckpt.config) if analysis.family is not None else ()
    if dspark:
        analysis = without_mtp_layers(analysis)
    checks = _model_checks(ckpt, analysis)
    if dspark:
        count = dspark_count_check(analysis, dspark, dict(ckpt.tensors))
        checks = tuple(count if c.name is CheckName.MTP_COUNT else c for c in checks)
    if kind is not None:
        return drafter_report(
            ckpt, kind, compare, target, family_checks=checks[1:], tokenizers=tokenizers
        )
    return Report(command="inspect", inputs=(summarise(ckpt, analysis),), checks=checks)


def _model_checks(ckpt: Checkpoint, analysis: MtpAnalysis) -> tuple[CheckResult, ...]:
    """The checks of a model checkpoint and its MTP layers."""
    quantization = quantization_check(analysis, ckpt.tensors, declared_scheme(ckpt))
    return (
        integrity_check([("", ckpt)]),
        family_check(analysis),
        main_model_check(ckpt, analysis),
        _with_writer_note(_with_draft_note(count_check(analysis), ckpt, analysis), ckpt, analysis),
        layers_check(analysis),
        shapes_check(analysis, ckpt.tensors, ckpt.config),
        copies_check(ckpt, analysis),
        trained_check(ckpt, analysis),
        serving_check(ckpt.config, analysis, ckpt.tensors),
        *((quantization,) if quantization is not None else ()),
    )
