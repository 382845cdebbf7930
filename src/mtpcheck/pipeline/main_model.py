"""Is the source's main model whole? Checked against megatron-core's model of its config.

``inspect`` judges the MTP layers against the main layers they mirror; it cannot tell that a
main layer lost an expert or a norm, since nothing in one checkpoint says what a layer must
hold. A conversion can: megatron-core's ``GPTModel`` of the source's config holds a known set
of tensors (``megatron_names.expected_model_names``, checked against real GPTModels in the
tests), and a source that maps to less, more, or other shapes cannot be converted faithfully.
A converter would write such a source as a checkpoint megatron-core cannot load, or crash
half-way; so ``roundtrip`` and ``convert`` check it with the source, before converting.

Only the main model is judged here (embedding, decoder layers, final norm, output head); the
MTP layers are ``inspect``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mtpcheck.convert import builtin, megatron_names
from mtpcheck.errors import ConfigKeyError, InputError, MtpcheckError
from mtpcheck.families import MtpFamily, detect_family
from mtpcheck.families.name_templates import EXPERT, NameTemplate
from mtpcheck.formats.torch_dist_keys import DECODER_LAYER, FUSED_NORMS
from mtpcheck.mapping import as_megatron
from mtpcheck.mapping.rules import DECODER_RULES, top_level
from mtpcheck.model import CheckName, Checkpoint, CheckResult, Finding, Status, TensorMeta

NAME = CheckName.MCORE_MODEL
TITLE = "Main model as megatron-core's GPTModel of the config holds it"

_NORM_ALIASES = {f.fused: f.norm for f in FUSED_NORMS}
"""Norms that layer specs fuse into the next linear layer, by their unfused names: the same
norm under the names of the local and the Transformer Engine specs."""


def _canonical(name: str) -> str:
    """``name`` with a decoder layer's fused norm spelled as its plain norm."""
    m = DECODER_LAYER.match(name)
    if m is None:
        return name
    prefix, rel = name[: m.end()], name[m.end() :]
    for fused, plain in _NORM_ALIASES.items():
        if rel.startswith(fused):
            return prefix + plain + rel[len(fused) :]
    return name


def _hf_sources(megatron: str, family: MtpFamily | None) -> tuple[str, ...]:
    """The HF tensors of ``family`` a Megatron main-model tensor is made from (as the mapping
    rules say), for messages; empty when no rule names them."""
    if family is None:
        return ()
    for hf, meg in top_level(family.layout.main_shared, family.layout.main_norm):
        if meg == megatron:
            return (hf,)
    m = DECODER_LAYER.match(megatron)
    if m is None:
        return ()
    rel = megatron[m.end() :]
    hf_prefix = NameTemplate(family.layout.main_layer_prefix).main_layer(m.group(1))
    for rule in DECODER_RULES:
        found = NameTemplate(rule.megatron).match(rel)
        if found is not None:
            e = found.get(EXPERT)
            return tuple(
                hf_prefix + (h if e is None else NameTemplate(h).expert(e)) for h in rule.hf
            )
    return ()


def _skip(reason: str) -> CheckResult:
    return CheckResult(NAME, TITLE, (Finding("main model", Status.SKIP, reason),))


def mcore_model_check(hf: Checkpoint) -> CheckResult:
    """An HF source: its main model, mapped to Megatron names, against megatron-core's model
    of its config (SKIP for a family the built-in converter does not describe)."""
    try:
        key = builtin.require_writable(hf)
    except InputError as e:
        return _skip(f"not judged: {e.reason}")
    where = f"{hf.path}/config.json"
    try:
        view = as_megatron(hf)
    except MtpcheckError as e:
        if isinstance(e, ConfigKeyError):  # the config, not the tensors: input (exit 2)
            raise
        finding = Finding("main model", Status.FAIL, f"cannot be mapped to Megatron names: {e}")
        return CheckResult(NAME, TITLE, (finding,))
    return _judge(view.tensors, view.sources, view.plan.unmapped, key, hf.config, where)


def megatron_mcore_model_check(megatron: Checkpoint, hf_config: Mapping[str, Any]) -> CheckResult:
    """A Megatron source: its main model against megatron-core's model of ``hf_config``."""
    try:
        key = builtin.writer_family(hf_config, megatron.path)
    except InputError as e:
        return _skip(f"not judged: {e.reason}")
    return _judge(megatron.tensors, {}, (), key, hf_config, megatron.path)


def _judge(
    tensors: Mapping[str, TensorMeta],
    sources: Mapping[str, str],
    unmapped: tuple[str, ...],
    key: str,
    hf_config: Mapping[str, Any],
    where: str,
) -> CheckResult:
    """One FAIL per main-model tensor (canonical Megatron names) megatron-core's model of the
    config holds and ``tensors`` lack, hold in another shape, or hold beyond it; and one per
    source tensor no mapping rule covers (``unmapped``). A config that lacks a key the model
    needs is input mtpcheck cannot judge (a :class:`ConfigKeyError` naming ``where``)."""
    try:
        expected = megatron_names.expected_model_names(key, hf_config)
    except ConfigKeyError as e:
        raise e.at(where) from e

    family = detect_family(hf_config)

    def main(name: str) -> bool:
        return not name.startswith("mtp.")

    def source(name: str) -> str:
        return f" [from {sources[name]}]" if name in sources else ""

    want = {_canonical(n): tuple(s) for n, s in expected.items() if main(n)}
    have = {_canonical(n): m.shape for n, m in tensors.items() if main(n)}
    findings = []
    for name in sorted(want.keys() - have.keys()):
        made_of = _hf_sources(name, family)
        hint = f"; it is made from {' + '.join(made_of)}" if made_of and sources else ""
        findings.append(
            Finding(
                name,
                Status.FAIL,
                f"missing: megatron-core's model of this config holds it{hint}",
                {"hf": list(made_of)},
            )
        )
    findings += [
        Finding(
            name,
            Status.FAIL,
            f"shape {list(have[name])}{source(name)}, megatron-core's model of this config "
            f"holds {list(want[name])}",
        )
        for name in sorted(want.keys() & have.keys())
        if want[name] != have[name]
    ]
    findings += [
        Finding(name, Status.FAIL, f"not in megatron-core's model of this config{source(name)}")
        for name in sorted(have.keys() - want.keys())
    ]
    findings += [
        Finding(name, Status.FAIL, "has no Megatron counterpart (a part of it is missing?)")
        for name in unmapped
    ]
    if findings:
        return CheckResult(NAME, TITLE, tuple(findings))
    message = f"{len(want)} main-model tensors, as megatron-core's model of the config holds them"
    return CheckResult(NAME, TITLE, (Finding("main model", Status.PASS, message),))
