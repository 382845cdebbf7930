"""How a quantized checkpoint stores its MTP layers, and whether that agrees with what its
quantization config tells a serving engine to build.

An engine builds each module from the config: quantized where the scheme quantizes it, plain
where an ignore entry leaves it out. Weights stored in the other form do not load (vLLM:
shape assertions, "No compressed-tensors compatible scheme"), or load into a layer that is
then left uninitialised (vLLM #37667: 0 % acceptance).
"""

from __future__ import annotations

from collections.abc import Mapping

from mtpcheck.families import MtpAnalysis
from mtpcheck.model import CheckResult, Finding, Status, TensorMeta
from mtpcheck.params import LogicalParam, Method, Scheme, group, stored_forms
from mtpcheck.params.storage import Storage, describe_storages, is_matrix, storage_of
from mtpcheck.units import first_few

NAME = "mtp-quantization"
TITLE = "MTP storage against the quantization config"
_SHOWN = 3


def _module(param: LogicalParam) -> str:
    return param.name.removesuffix(".weight")


def _counterpart(name: str, tensors: Mapping[str, TensorMeta]) -> LogicalParam | None:
    """The main layer's parameter ``name``, in whatever form it is stored."""
    held = [n for n in stored_forms(name) if n in tensors]
    return group(held).get(name) if held else None


def _scheme_words(scheme: Scheme) -> str:
    words = scheme.declared or scheme.method.value
    if scheme.formats:
        words += " " + "/".join(scheme.formats)
    if scheme.group_size:
        words += f", group {scheme.group_size}"
    return words


def quantization_check(
    analysis: MtpAnalysis, tensors: Mapping[str, TensorMeta], scheme: Scheme
) -> CheckResult | None:
    """One finding per MTP layer (its storage, beside the main layers'), plus a FAIL for each
    kind of disagreement with the config; None for a checkpoint nothing quantizes."""
    mirrors = dict(analysis.mirrors)
    layers = []
    quantized_anywhere = scheme.method is not Method.NONE
    for layer in analysis.layers:
        if not layer.present:
            continue
        own: list[tuple[LogicalParam, Storage, Storage | None]] = []
        prefix_len = len(layer.prefix)
        for param in group(layer.present).values():
            if not is_matrix(param, tensors):
                continue
            storage = storage_of(param, tensors, scheme)
            main = None
            for prefix, main_prefix in mirrors.items():
                if param.name.startswith(prefix):
                    found = _counterpart(main_prefix + param.name[len(prefix) :], tensors)
                    main = storage_of(found, tensors, scheme) if found else None
                    break
            own.append((param, storage, main))
            quantized_anywhere |= storage.quantized or bool(main and main.quantized)
        layers.append((layer.index, prefix_len, own))
    if not quantized_anywhere:
        return None
    findings: list[Finding] = []
    for index, prefix_len, own in layers:
        findings += _layer_findings(index, prefix_len, own, scheme)
    if not findings:
        findings.append(Finding("mtp layers", Status.SKIP, "no MTP weight matrices present"))
    return CheckResult(NAME, TITLE, tuple(findings))


_Own = list[tuple[LogicalParam, Storage, Storage | None]]
"""An MTP layer's weight matrices: each with its storage and its main-layer counterpart's."""


def _layer_findings(index: int, prefix_len: int, own: _Own, scheme: Scheme) -> list[Finding]:
    """One MTP layer: a FAIL for each way its storage and the declared scheme disagree (what
    an engine then cannot load), else a PASS saying how it is stored."""
    if not own:
        return []
    subject = f"mtp layer {index}"

    def short(param: LogicalParam) -> str:
        module = _module(param)
        return module[prefix_len:] if len(module) > prefix_len else module

    stored = describe_storages((short(p), s) for p, s, _ in own)
    mains = [(short(p), m) for p, _, m in own if m is not None]
    main = describe_storages(mains) if mains else None
    findings = [
        *_undeclared(subject, own, scheme, stored),
        *_ignored_but_packed(subject, own, scheme, stored),
        *_plain_but_quantized(subject, own, scheme, stored, main),
    ]
    if findings:
        return findings
    kept = sorted(short(p) for p, s, _ in own if not s.quantized)
    return [_agreement(subject, own, scheme, (stored, main), bool(kept))]


def _undeclared(subject: str, own: _Own, scheme: Scheme, stored: str) -> list[Finding]:
    """Weights stored quantized under a config that declares no quantization."""
    modules = sorted(_module(p) for p, s, _ in own if s.quantized and scheme.method is Method.NONE)
    if not modules:
        return []
    message = (
        f"{first_few(modules, _SHOWN)}: stored quantized ({stored}), but the config declares no "
        "quantization_config, so engines build them in full precision and cannot load them"
    )
    return [Finding(subject, Status.FAIL, message, {"modules": modules})]


def _ignored_but_packed(subject: str, own: _Own, scheme: Scheme, stored: str) -> list[Finding]:
    """Weights stored quantized that the declared scheme's ignore list keeps unquantized."""
    ignored = sorted(
        (_module(p), entry)
        for p, s, _ in own
        if s.quantized and (entry := scheme.ignoring_entry(_module(p))) is not None
    )
    if not ignored:
        return []
    modules = [m for m, _ in ignored]
    entry = ignored[0][1]
    message = (
        f"{first_few(modules, _SHOWN)}: stored quantized ({stored}), but quantization_config "
        f"ignores them (entry {entry!r}), so engines build them unquantized and cannot load them"
    )
    return [Finding(subject, Status.FAIL, message, {"modules": modules, "entry": entry})]


def _plain_but_quantized(
    subject: str, own: _Own, scheme: Scheme, stored: str, main: str | None
) -> list[Finding]:
    """Weights stored in full precision that the declared scheme quantizes, as it does their
    quantized main-layer counterparts (no ignore entry matches them)."""
    modules = sorted(
        _module(p)
        for p, s, m in own
        if not s.quantized
        and m is not None
        and m.quantized
        and scheme.method is not Method.NONE
        and scheme.ignoring_entry(_module(p)) is None
    )
    if not modules:
        return []
    message = (
        f"{first_few(modules, _SHOWN)}: stored {stored}, but quantization_config "
        f"({_scheme_words(scheme)}) quantizes them as it does the main layers ({main}) "
        "and no ignore entry matches, so engines build them quantized and cannot load "
        "these weights"
    )
    return [Finding(subject, Status.FAIL, message, {"modules": modules})]


def _agreement(
    subject: str, own: _Own, scheme: Scheme, storages: tuple[str, str | None], kept: bool
) -> Finding:
    """How a layer whose storage agrees with the scheme is stored, beside its main layers;
    ``kept``: some of its weights are in full precision."""
    stored, main = storages
    if main is None:
        how = f"stored {stored}"
    elif main == stored:
        how = f"stored {stored}, like the main layers,"
    else:
        how = f"stored {stored} where the main layers are {main}"
    entry = next(
        (e for p, s, _ in own if not s.quantized and (e := scheme.ignoring_entry(_module(p)))), None
    )
    said = f" under {_scheme_words(scheme)}" if scheme.method is not Method.NONE else ""
    if entry and kept:
        said += f"; kept in full precision by ignore entry {entry!r}"
    return Finding(subject, Status.PASS, how + said, {"storage": stored, "main": main})
