"""How a quantized checkpoint stores its MTP layers, and whether that agrees with what its
quantization config tells a serving engine to build.

An engine builds each module from the config: quantized where the scheme quantizes it, plain
where an ignore entry leaves it out. Weights stored in the other form do not load (vLLM:
shape assertions, "No compressed-tensors compatible scheme"), or load into a layer that is
then left uninitialised (vLLM #37667: 0 % acceptance).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mtpcheck.dtypes import is_high_precision
from mtpcheck.families import MtpAnalysis
from mtpcheck.model import CheckName, CheckResult, Finding, Status, TensorMeta, TensorTable
from mtpcheck.model.tensors import names_of
from mtpcheck.params import LogicalParam, Method, Scheme, group, stored_forms
from mtpcheck.params.parts import LOGICAL_SUFFIX, PARTS, Role
from mtpcheck.params.storage import Storage, describe_storages, is_matrix, storage_of
from mtpcheck.units import first_few

NAME = CheckName.MTP_QUANTIZATION
TITLE = "MTP storage against the quantization config"
_SHOWN = 3


def _module(param: LogicalParam) -> str:
    return param.name.removesuffix(".weight")


def _counterparts(
    names: Iterable[str], tensors: Mapping[str, TensorMeta]
) -> dict[str, LogicalParam]:
    """The main layers' parameters ``names``, in whatever form each is stored. Those named
    ``<module>.weight`` are grouped in one pass: each of their stored forms is
    ``<module>.<suffix>`` (no part's suffix ends another's), so a held name groups under its
    own module alone, and grouping them all at once gives each parameter what grouping its own
    forms would. Any other name is its only form, grouped alone as before."""
    found: dict[str, LogicalParam] = {}
    weights: dict[str, None] = {}
    held = names_of(tensors)  # ~25 forms a parameter are looked up: in C
    for name in names:
        if name.endswith("." + LOGICAL_SUFFIX):
            weights.update(dict.fromkeys(filter(held.__contains__, stored_forms(name))))
        elif name in held and (alone := group([name]).get(name)) is not None:
            found[name] = alone
    return {**group(weights), **found}


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
    if scheme.method is Method.NONE and not _may_be_quantized(tensors):
        return None  # nothing to judge: no scheme, and no tensor stored quantized
    layers = _matrices(analysis, tensors)
    mains = _counterparts((m for _, _, own in layers for _, m in own if m is not None), tensors)
    storage = _Storages(tensors, scheme)
    judged: list[tuple[int, int, _Own]] = []
    for index, prefix_len, matrices in layers:
        stored: _Own = []
        for param, main_name in matrices:
            found = mains.get(main_name) if main_name is not None else None
            stored.append((param, storage.of(param), storage.of(found) if found else None))
        judged.append((index, prefix_len, stored))
    if scheme.method is Method.NONE and not storage.quantized:
        return None
    findings: list[Finding] = []
    for index, prefix_len, own in judged:
        findings += _layer_findings(index, prefix_len, own, scheme)
    if not findings:
        findings.append(Finding("mtp layers", Status.SKIP, "no MTP weight matrices present"))
    return CheckResult(NAME, TITLE, tuple(findings))


_VALUE_PARTS = tuple(
    f".{p.suffix}\n" for p in PARTS if p.role in (Role.PACKED, Role.CODEBOOK, Role.QUANT_STATE)
)
"""How a name that stores packed values or their codebook ends, in the names joined by lines."""


def _may_be_quantized(tensors: Mapping[str, TensorMeta]) -> bool:
    """False only when no parameter can be stored quantized: every tensor is a 16- or 32-bit
    float, and no name is a packed weight, a codebook or a quant state (what makes float
    values quantized: see :func:`~mtpcheck.params.encodings.encoding_of`). Column by column
    and in one joined text, not tensor by tensor (DeepSeek-V3 has 92k)."""
    if isinstance(tensors, TensorTable):
        dtypes = {d for part in tensors.parts for d in set(part.dtypes)}
    else:
        dtypes = {meta.dtype for meta in tensors.values()}
    if not all(map(is_high_precision, dtypes)):
        return True
    joined = "\n".join(tensors) + "\n"
    return any(suffix in joined for suffix in _VALUE_PARTS)


_Matrices = list[tuple[int, int, list[tuple[LogicalParam, str | None]]]]
"""Per MTP layer present: (index, prefix length, each weight matrix with the name of its
main-layer counterpart, None where no mirror prefix covers it)."""


def _matrices(analysis: MtpAnalysis, tensors: Mapping[str, TensorMeta]) -> _Matrices:
    """The MTP layers' weight matrices, each with its main counterpart's name."""
    mirrors = dict(analysis.mirrors)
    layers: _Matrices = []
    for layer in analysis.layers:
        if not layer.present:
            continue
        own: list[tuple[LogicalParam, str | None]] = []
        for param in group(layer.present).values():
            if not is_matrix(param, tensors):
                continue
            main = None
            for prefix, main_prefix in mirrors.items():
                if param.name.startswith(prefix):
                    main = main_prefix + param.name[len(prefix) :]
                    break
            own.append((param, main))
        layers.append((layer.index, len(layer.prefix), own))
    return layers


class _Storages:
    """:func:`storage_of` once per distinct stored form: a layer's experts repeat one form
    hundreds of times. The key holds all that :func:`storage_of` reads of a parameter: each
    part's role, name (past ``<module>.`` when it starts so: the suffix alone is read), dtype
    and shape. Remembers whether any storage was quantized."""

    def __init__(self, tensors: Mapping[str, TensorMeta], scheme: Scheme) -> None:
        self.tensors, self.scheme = tensors, scheme
        self.known: dict[tuple[object, ...], Storage] = {}
        self.quantized = False

    def of(self, param: LogicalParam) -> Storage:
        """What ``param`` is stored as."""
        module = _module(param) + "."
        cut = len(module) if param.name.endswith("." + LOGICAL_SUFFIX) else 0
        key = tuple(
            (role, name[cut:] if cut and name.startswith(module) else name, *_form(meta))
            for role, name in param.parts
            for meta in (self.tensors.get(name),)
        )
        found = self.known.get(key)
        if found is None:
            found = self.known[key] = storage_of(param, self.tensors, self.scheme)
            self.quantized |= found.quantized
        return found


def _form(meta: TensorMeta | None) -> tuple[object, ...]:
    return () if meta is None else (meta.dtype, meta.shape)


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
