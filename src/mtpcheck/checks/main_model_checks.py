"""Is the main model whole? Every decoder layer the config declares, each holding what its
kind holds, every routed expert, the embedding, the final norm and the head (pure).

Exports that lose MTP layers lose main weights with them (a shard left out, a layer short, a
layer's routed experts dropped by a merge), and the MTP checks cannot see that. What a layer
must hold is read from two places: the config (how many layers, the kind of each, the routed
experts of an MoE layer, a tied head: :mod:`mtpcheck.families.main_layout`) and the other
layers of the same kind in the same checkpoint (their tensor names and shapes). Names are
compared as logical parameters, so a quantized weight with its scales is one tensor, in any
format's names (HF, Megatron, GGUF). A layer that is the only one of its kind is held to the
config alone: present, with its experts; the report says so.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mtpcheck.dtypes import is_high_precision
from mtpcheck.families import MtpAnalysis
from mtpcheck.families.main_layout import MainLayout, main_layout
from mtpcheck.families.name_templates import LayerNames
from mtpcheck.model import (
    Checkpoint,
    CheckResult,
    Finding,
    MainModelElsewhere,
    Naming,
    Status,
    TensorMeta,
)
from mtpcheck.model.config_keys import is_int, text_value
from mtpcheck.params import group, stored_forms

NAME = "main-model"
TITLE = "Main model held to its config"

_GROUPED_EXPERT = re.compile(r"^(.*experts\.linear_fc\d\.(?:weight|bias))(\d+)$")
"""Transformer Engine's grouped experts: ``mlp.experts.linear_fc1.weight{e}``."""
_MLP_BLOCKS = frozenset(
    {"mlp", "moe", "ffn", "block_sparse_moe", "feed_forward", "share_expert", "shared_mlp"}
)
"""Modules that are a layer's MLP (dense or MoE): they differ between dense and MoE layers."""
_MLP_FACTS = frozenset({"mlp", "mlp_layer_types", "routed experts"})
"""Kind facts about the MLP alone: layers differing only there share their other modules."""
_STACKED = re.compile(r"(?:^|\.)experts\.|_exps\.")
"""Names of routed experts stored stacked in one tensor (``mlp.experts.gate_up_proj``,
llama.cpp's ``ffn_up_exps.weight``), not a shared expert's."""


_Kind = tuple[tuple[str, str], ...]
"""A layer's kind: (fact, value) pairs."""


@dataclass(frozen=True)
class _Layer:
    """One main layer's tensors, as logical parameters relative to its prefix."""

    names: frozenset[str]
    """Every parameter, a routed expert's index written ``*``."""
    experts: Mapping[int, frozenset[str]]
    """Routed expert index -> the expert's own parameters (``down_proj.weight``)."""
    shapes: Mapping[str, tuple[str, tuple[int, ...]]]
    """Parameter (expert index ``*``) -> (dtype, shape) of its stored values."""
    count: int
    """Parameters held, each expert's counted."""
    blocks: frozenset[str]
    """The modules it is made of (``self_attn``, ``mlp``; llama.cpp's ``attn``, ``ffn``,
    ``ssm``): a layer of a hybrid stack differs from its neighbours there."""
    by_block: Mapping[str, frozenset[str]]
    """Module -> its parameters; ``""`` for the layer's own (its norms)."""

    @property
    def routed(self) -> bool:
        return bool(self.experts) or any(_STACKED.search(n) for n in self.names)


def _expert_of(rel: str) -> tuple[str, int, str] | None:
    """(name with the index as ``*``, expert index, the expert's own parameter), by string
    search (a DeepSeek-V3 layer holds 1,536 expert tensors)."""
    at = rel.find("experts.")
    if at < 0:
        return None
    start = at + len("experts.")
    if rel.startswith("local_experts.", start):  # Megatron's SequentialMLP
        start += len("local_experts.")
    end = rel.find(".", start)
    if end > start and rel[start:end].isdigit():
        return f"{rel[:start]}*{rel[end:]}", int(rel[start:end]), rel[end + 1 :]
    m = _GROUPED_EXPERT.match(rel) if rel[-1:].isdigit() else None
    if m is not None:
        return f"{m.group(1)}*", int(m.group(2)), m.group(1).rsplit(".", 2)[-2]
    return None


def _block(rel: str, naming: Naming) -> str | None:
    """The module a parameter belongs to, if it is in one: the first part of a name with a
    module path (not a layer's own norm), or llama.cpp's prefix (``attn_q`` -> ``attn``)."""
    parts = rel.split(".")
    if naming is Naming.GGUF:
        return parts[0].split("_", 1)[0]
    if len(parts) >= 3 or (len(parts) == 2 and parts[1] not in ("weight", "bias")):
        return parts[0]  # a module's parameter (``mlp.expert_bias`` too)
    return None


_Folded = tuple[set[str], dict[int, set[str]], dict[str, str]]
"""Names with each routed expert's index written ``*``; expert index -> its own parameters;
folded name -> one stored name it stands for (its shape is every expert's)."""


def _fold(rels: frozenset[str]) -> _Folded:
    """The routed experts of a layer folded, name by name."""
    folded: set[str] = set()
    held: dict[int, set[str]] = {}
    first: dict[str, str] = {}
    for rel in rels:
        found = _expert_of(rel)
        if found is None:
            folded.add(rel)
            continue
        name, index, own = found
        held.setdefault(index, set()).add(own)
        if name not in folded:
            folded.add(name)
            first[name] = rel
    return folded, held, first


_EXPERT_INDEX = re.compile(r"experts\.(\d+)\.")
"""A routed expert's index, HF's and Megatron's ``local_experts`` alike; the whole match is
replaced by a literal (``re.sub`` then stays in C)."""
_GROUPED_INDEX = {
    fc: re.compile(rf"experts\.{fc}\.weight(\d+)$", re.M) for fc in ("linear_fc1", "linear_fc2")
}
"""Transformer Engine's grouped experts' indices, by projection."""


def _fold_fast(rels: frozenset[str]) -> _Folded | None:
    """The routed experts of a layer folded by regular expressions over all its names at once
    (C speed: DeepSeek-V3 has 92k names), where every expert holds the same parameters; None
    where they do not (a damaged layer, folded name by name to say which lacks what)."""
    joined = "\n".join(rels)
    indices = _EXPERT_INDEX.findall(joined)
    if indices:
        joined = _EXPERT_INDEX.sub("experts.*.", joined)
    if "experts.linear_fc" in joined:
        for fc, pattern in _GROUPED_INDEX.items():
            indices += pattern.findall(joined)
            joined = pattern.sub(f"experts.{fc}.weight*", joined)
    if not indices:
        return set(rels), {}, {}
    folded = set(joined.split("\n"))
    star = [n for n in folded if "*" in n]
    per_expert = set(Counter(indices).values())
    if len(per_expert) != 1 or per_expert.pop() != len(star):
        return None
    own = {n[n.index("*") + 2 :] if "*." in n else n[:-1].rsplit(".", 2)[-2] for n in star}
    numbers = {int(i) for i in set(indices)}
    low = str(min(numbers))
    first = {n: n.replace("*", low, 1) for n in star}
    return folded, dict.fromkeys(numbers, own), first


def _layer(
    prefix: str, rels: frozenset[str], tensors: Mapping[str, TensorMeta], naming: Naming
) -> _Layer:
    """One layer's tensors as logical parameters, with the shapes its stored values have."""
    structure, stored = _structure(rels, naming)
    shapes: dict[str, tuple[str, tuple[int, ...]]] = {}
    for logical, values in stored.items():
        meta = tensors.get(prefix + values)
        if meta is not None:
            shapes[logical] = (meta.dtype, tuple(meta.shape))
    return replace(structure, shapes=shapes)


@functools.lru_cache(maxsize=16)
def _structure(rels: frozenset[str], naming: Naming) -> tuple[_Layer, Mapping[str, str]]:
    """What a layer of these relative names holds (shapes left empty), and parameter -> the
    stored name of its values. Routed experts are folded into one name a projection (index
    ``*``) before grouping, so that grouping sees a few dozen names a layer rather than every
    expert's; layers of the same names (DeepSeek-V3's 58 MoE layers) are worked out once."""
    folded, held, first = _fold_fast(rels) or _fold(rels)
    params = group(folded)
    stored = {
        logical: first.get(param.values, param.values)
        for logical, param in params.items()
        if param.values is not None
    }
    parts = (
        {
            stored_name: logical
            for logical, p in group(set().union(*held.values())).items()
            for stored_name in p.stored
        }
        if held
        else {}
    )
    logical: dict[int, frozenset[str]] = {}  # by id of a stored set: experts share one
    frozen = {
        e: logical.setdefault(id(owns), frozenset(parts[own] for own in owns))
        for e, owns in held.items()
    }
    names = set(params)
    count = sum(1 for n in names if "*" not in n) + sum(len(p) for p in frozen.values())
    by_block: dict[str, set[str]] = {}
    for n in names:
        by_block.setdefault(_block(n, naming) or "", set()).add(n)
    blocks = frozenset(b for b in by_block if b)
    grouped = {b: frozenset(ns) for b, ns in by_block.items()}
    return _Layer(frozenset(names), frozen, {}, count, blocks, grouped), stored


def _few(names: list[str], shown: int = 4) -> str:
    return ", ".join(names[:shown]) + (
        f" and {len(names) - shown} more" if len(names) > shown else ""
    )


def _kind_key(layout: MainLayout, k: int, routed: bool | None) -> _Kind:
    """What groups layer ``k`` with its peers: the config's facts about it, and where the config
    does not say which layers are MoE, whether it holds routed experts (``routed``)."""
    kind = layout.kinds[k] if layout.kinds else ()
    if layout.moe_layers is None and routed is not None:
        kind = (*kind, ("routed experts", "yes" if routed else "no"))
    return kind


def _present(name: str, tensors: Mapping[str, TensorMeta]) -> bool:
    return any(form in tensors for form in stored_forms(name))


def _top_level(
    config: Mapping[str, Any],
    analysis: MtpAnalysis,
    layout: MainLayout,
    tensors: Mapping[str, TensorMeta],
    naming: Naming,
) -> list[Finding]:
    """The embedding, the final norm and (untied) the head: present, and in HF names of the
    shape the config gives (transformers builds them so, and refuses another shape)."""
    family = analysis.family
    assert family is not None
    wanted = [
        (family.main_shared[0], "the embedding"),
        (family.main_norm, "the final norm"),
    ]
    if not layout.tied and len(family.main_shared) > 1:
        wanted.append((family.main_shared[1], "the output head (the config does not tie it)"))
    findings = [
        Finding(name, Status.FAIL, f"missing: {what} of the main model")
        for name, what in wanted
        if not _present(name, tensors)
    ]
    if naming is not Naming.HF:
        return findings
    return findings + _vocab_shapes(config, wanted[::2], tensors)


def _vocab_shapes(
    config: Mapping[str, Any], wanted: list[tuple[str, str]], tensors: Mapping[str, TensorMeta]
) -> list[Finding]:
    """The embedding and head as ``[vocab_size, hidden_size]`` where stored unquantized."""
    vocab = text_value(config, "vocab_size", is_int)
    hidden = text_value(config, "hidden_size", is_int)
    if vocab is None or hidden is None:
        return []
    want = [vocab[1], hidden[1]]
    findings = []
    for name, what in wanted:
        meta = tensors.get(name)
        if meta is None or not is_high_precision(meta.dtype) or list(meta.shape) == want:
            continue
        message = f"shape {list(meta.shape)}, where {what.split(' (')[0]} of this config is "
        findings.append(Finding(name, Status.FAIL, message + f"{want} (vocab_size, hidden_size)"))
    return findings


def main_model_check(ckpt: Checkpoint, analysis: MtpAnalysis) -> CheckResult:
    """Every main-model tensor the config implies, present and shaped as its peers'."""
    family = analysis.family
    elsewhere = ckpt.main_model_elsewhere if isinstance(ckpt, MainModelElsewhere) else ""
    if family is None or elsewhere:
        why = elsewhere or "the family is unknown, so is what it holds"
        return CheckResult(
            NAME, TITLE, (Finding("main model", Status.SKIP, f"not checked: {why}"),)
        )
    config, tensors, naming = ckpt.config, ckpt.tensors, ckpt.naming
    layout = main_layout(family, config, len(_mtp_layer_numbers(analysis)))
    findings = _top_level(config, analysis, layout, tensors, naming)
    if layout.layers is None:
        findings.append(
            Finding(
                "main layers",
                Status.SKIP,
                "not checked: the config does not say how many decoder layers there are",
            )
        )
        return CheckResult(NAME, TITLE, tuple(findings))
    names = sorted(tensors)
    layers = _main_layers(analysis, layout, tensors, names, naming)
    cross = _cross_checks(layout, naming)
    peers = _peers(layout, layers, analysis, cross)
    per_expert = any(x.experts for x in layers.values()) or any(
        _expert_of(n) is not None for n in analysis.mtp_names
    )
    mirrored = _mirrored(analysis, tensors, names, naming)
    findings += _layer_findings(layout, layers, peers, per_expert, mirrored)
    if not any(f.status is Status.FAIL for f in findings):
        covered = _covered(layout, layers, peers, cross)
        findings.append(Finding("main model", Status.PASS, covered))
    return CheckResult(NAME, TITLE, tuple(findings))


def _main_layers(
    analysis: MtpAnalysis,
    layout: MainLayout,
    tensors: Mapping[str, TensorMeta],
    names: list[str],
    naming: Naming,
) -> dict[int, _Layer]:
    """Main layers 0 .. layers - 1 that hold a tensor, leaving out MTP layers that share the
    main layers' prefix (MTP layers counted inside ``num_hidden_layers``)."""
    family = analysis.family
    assert family is not None and layout.layers is not None
    template = family.main_layer_prefix.replace("{k}", "{n}")
    by_layer = LayerNames(names, template, layout.layers)
    mtp_inside = {int(k) for k in _mtp_layer_numbers(analysis)}
    found = {}
    for k in by_layer:
        if k not in mtp_inside:
            prefix = family.main_layer_prefix.replace("{k}", str(k))
            found[k] = _layer(prefix, by_layer[k], tensors, naming)
    return found


def _cross_checks(layout: MainLayout, naming: Naming) -> bool:
    """Whether layers the config does not tell apart hold the same tensors: where it lists
    layer kinds, and in HF names (transformers builds every layer from the config, so a hybrid
    stack's config says which layer is which). Megatron's and llama.cpp's metadata may not."""
    return any(layout.kinds) or naming is Naming.HF


def _peers(
    layout: MainLayout, layers: Mapping[int, _Layer], analysis: MtpAnalysis, cross: bool
) -> dict[_Kind, list[int]]:
    """Main layers by kind (leaving out MTP layers numbered as main ones); without ``cross``,
    each layer a kind of its own."""
    assert layout.layers is not None
    mtp_inside = {int(k) for k in _mtp_layer_numbers(analysis)}
    # a layer that is gone is taken to be MoE or dense as most layers the config calls alike
    usual: dict[_Kind, Counter[bool]] = {}
    for k, layer in layers.items():
        usual.setdefault(_kind_key(layout, k, None), Counter())[layer.routed] += 1
    peers: dict[_Kind, list[int]] = {}
    for k in range(layout.layers):
        if k in mtp_inside:
            continue
        if not cross:
            kind: _Kind = (("layer", str(k)),)
        elif k in layers:
            kind = _kind_key(layout, k, layers[k].routed)
        else:
            seen = usual.get(_kind_key(layout, k, None))
            kind = _kind_key(layout, k, seen.most_common(1)[0][0] if seen else None)
        peers.setdefault(kind, []).append(k)
    return peers


def _layer_findings(
    layout: MainLayout,
    layers: Mapping[int, _Layer],
    peers: Mapping[_Kind, list[int]],
    per_expert: bool,
    mirrored: Mapping[int, list[tuple[str, _Layer]]],
) -> list[Finding]:
    """One finding per damaged main layer. ``per_expert``: the checkpoint stores routed
    experts one tensor each (in some main or MTP layer); ``mirrored``: the MTP blocks that
    mirror a main layer, by its number."""
    findings = []
    groups: dict[tuple[frozenset[str], tuple[int, ...]], _PeerGroup] = {}
    for kind, kind_layers in peers.items():
        others = [j for other, js in peers.items() if _same_besides_mlp(kind, other) for j in js]
        if any(key == "layer" for key, _ in kind):
            everyone = others  # the config does not tell kinds apart: no layer is held to others
        else:
            everyone = [j for js in peers.values() for j in js]
        for k in kind_layers:
            problems = _layer_problems(k, layout, layers, kind_layers, per_expert, groups)
            if not problems and len(kind_layers) == 1:
                problems = _block_problems(k, layers, others, everyone, mirrored.get(k, []))
            if problems:
                kind = layout.kind_words(k)
                subject = f"main layer {k}" + (f" ({kind})" if kind else "")
                findings.append(Finding(subject, Status.FAIL, "; ".join(problems)))
    return sorted(findings, key=lambda f: int(f.subject.split()[2]))


def _mtp_layer_numbers(analysis: MtpAnalysis) -> set[str]:
    """Main-prefix layer numbers that hold MTP layers (Ling-V2 counts them as hidden)."""
    family = analysis.family
    assert family is not None
    head, _, _ = family.main_layer_prefix.partition("{k}")
    found = set()
    for layer in analysis.layers:
        if layer.prefix.startswith(head):
            number = layer.prefix[len(head) :].split(".", 1)[0]
            if number.isdigit():
                found.add(number)
    return found


def _layers_named(layers: list[int]) -> str:
    shown = ", ".join(map(str, layers[:3])) + (" ..." if len(layers) > 3 else "")
    return ("main layer " if len(layers) == 1 else "main layers ") + shown


def _layer_problems(
    k: int,
    layout: MainLayout,
    layers: Mapping[int, _Layer],
    kind_layers: list[int],
    per_expert: bool,
    groups: dict[tuple[frozenset[str], tuple[int, ...]], _PeerGroup],
) -> list[str]:
    """What layer ``k`` lacks against the other present layers of its kind (``kind_layers``):
    those built of the same modules are its peers, name for name and shape for shape; a layer
    built of fewer modules than two or more others, alone in that, lost the rest."""
    present = [j for j in kind_layers if j != k and j in layers]
    layer = layers.get(k)
    if layer is None:
        if not present:
            return ["all its tensors missing (no tensor of this layer in the checkpoint)"]
        usual = Counter(layers[j].blocks for j in present).most_common(1)[0][0]
        j = next(j for j in present if layers[j].blocks == usual)
        return [f"all {layers[j].count} tensors missing (as main layer {j} of its kind holds them)"]
    peers = [j for j in present if layers[j].blocks == layer.blocks]
    group = groups.get((layer.blocks, tuple(sorted([k, *peers]))))
    if group is None:
        group = groups[(layer.blocks, tuple(sorted([k, *peers])))] = _PeerGroup.of(
            tuple(sorted([k, *peers])), layers
        )
    problems = []
    lacking = sorted(group.names - layer.names) if peers else []
    if lacking:
        problems.append(
            f"{len(lacking)} tensor(s) of its kind missing (as {_layers_named(peers)} "
            f"{'holds' if len(peers) == 1 else 'hold'} them): {_few(lacking)}"
        )
    if not peers and any(layout.kinds):
        # only where the config tells kinds apart: a hybrid stack it does not describe
        # (llama.cpp's metadata) mixes layers of other modules in one kind
        problems += _lost_blocks(layer, layers, present)
    problems += _expert_problems(k, layout, layer, per_expert)
    if peers:
        problems += _shape_problems(layer, group)
    return problems


def _same_besides_mlp(a: _Kind, b: _Kind) -> bool:
    """Two kinds that differ at most in their MLP (DeepSeek's dense first layers): their other
    modules are built alike. Kinds of layers the config does not describe never match."""
    if any(key == "layer" for key, _ in a):
        return a == b
    return [f for f in a if f[0] not in _MLP_FACTS] == [f for f in b if f[0] not in _MLP_FACTS]


def _block_problems(
    k: int,
    layers: Mapping[int, _Layer],
    others: list[int],
    everyone: list[int],
    blocks: list[tuple[str, _Layer]],
) -> list[str]:
    """A layer alone of its kind, module by module against layers differing only in their MLP
    (the attention of DeepSeek's one dense layer against the MoE layers'), its own norms
    against every layer's (``everyone``: a decoder layer's norms are its kind's whatever its
    attention or MLP), and its modules against the MTP blocks that mirror it (``blocks``:
    prefix, tensors)."""
    layer = layers.get(k)
    if layer is None:
        return []
    problems = _against_blocks(layer, blocks)
    for block in sorted(layer.by_block):
        if block in _MLP_BLOCKS:
            continue
        pool = everyone if not block else others
        holders = [j for j in pool if j != k and j in layers and block in layers[j].by_block]
        if not holders:
            continue
        union = frozenset().union(*(layers[j].by_block[block] for j in holders))
        lacking = sorted(union - layer.by_block[block])
        if lacking:
            where = f"its {block}" if block else "the layer's own"
            problems.append(
                f"{len(lacking)} tensor(s) of {where} missing (as {_layers_named(holders)} "
                f"{'holds' if len(holders) == 1 else 'hold'} them): {_few(lacking)}"
            )
    return problems


def _against_blocks(layer: _Layer, blocks: list[tuple[str, _Layer]]) -> list[str]:
    """The layer's modules against those of the MTP blocks mirroring it, module by module for
    the modules both hold (an MTP block's own norms and projection are no module of a main
    layer); an MLP only where both store routed experts alike (Qwen3.5 packs them in one and
    not the other, by design)."""
    problems = []
    for block in sorted(b for b in layer.by_block if b):
        alike = [(p, b) for p, b in blocks if block in b.by_block]
        if block in _MLP_BLOCKS:
            alike = [
                (p, b)
                for p, b in alike
                if b.routed == layer.routed and bool(b.experts) == bool(layer.experts)
            ]
        if not alike:
            continue
        union = frozenset().union(*(b.by_block[block] for _, b in alike))
        lacking = sorted(union - layer.by_block[block])
        if lacking:
            where = ", ".join(p for p, _ in alike)
            problems.append(
                f"{len(lacking)} tensor(s) of its {block} missing (as the MTP block {where} "
                f"mirroring it holds them): {_few(lacking)}"
            )
    return problems


def _mirrored(
    analysis: MtpAnalysis, tensors: Mapping[str, TensorMeta], names: list[str], naming: Naming
) -> dict[int, list[tuple[str, _Layer]]]:
    """Main layer number -> the MTP blocks mirroring it (prefix, their tensors)."""
    family = analysis.family
    assert family is not None
    head, _, tail = family.main_layer_prefix.partition("{k}")
    found: dict[int, list[tuple[str, _Layer]]] = {}
    for block_prefix, main_prefix in analysis.mirrors:
        number = main_prefix[len(head) : len(main_prefix) - len(tail)]
        if not number.isdigit():
            continue
        start = bisect.bisect_left(names, block_prefix)
        rels = []
        for name in names[start:]:
            if not name.startswith(block_prefix):
                break
            rels.append(name[len(block_prefix) :])
        block = _layer(block_prefix, frozenset(rels), tensors, naming)
        found.setdefault(int(number), []).append((block_prefix, block))
    return found


def _lost_blocks(layer: _Layer, layers: Mapping[int, _Layer], present: list[int]) -> list[str]:
    """Modules the layer lacks where two or more layers of its kind hold them and more."""
    larger = Counter(
        layers[j].blocks for j in present if layer.blocks < layers[j].blocks
    ).most_common(1)
    if not larger or larger[0][1] < 2:
        return []
    blocks, _ = larger[0]
    holders = [j for j in present if layers[j].blocks == blocks]
    lost = sorted(blocks - layer.blocks)
    return [
        f"module(s) {', '.join(lost)} missing, with every tensor in them (as "
        f"{_layers_named(holders)} of its kind hold them)"
    ]


def _expert_problems(k: int, layout: MainLayout, layer: _Layer, per_expert: bool) -> list[str]:
    """Every routed expert 0 .. experts - 1, each with the parameters the others hold; and an
    MoE layer of a checkpoint that stores experts one tensor each must hold some."""
    if not layer.experts:
        moe = layout.moe_layers is not None and k in layout.moe_layers
        if moe and per_expert and not layer.routed:
            count = f" of {layout.experts}" if layout.experts else ""
            return [f"no routed experts: the config makes it an MoE layer{count}"]
        return []
    held = sorted(layer.experts)
    count = layout.experts if layout.experts and held[-1] < layout.experts else held[-1] + 1
    missing = [e for e in range(count) if e not in layer.experts]
    parts = frozenset().union(*layer.experts.values())
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of {count} routed experts missing: expert(s) "
            + _few([str(e) for e in missing], 8)
        )
    for e in held:
        lacks = sorted(parts - layer.experts[e])
        if lacks:
            problems.append(f"expert {e} of {count} lacks {', '.join(lacks)}")
    return problems


@dataclass(frozen=True)
class _PeerGroup:
    """Layers of one kind built of the same modules, taken together once (not pair by pair:
    DeepSeek-V3 has 58 alike)."""

    members: tuple[int, ...]
    names: frozenset[str]
    """Every parameter any of them holds."""
    shapes: Counter[tuple[str, str, tuple[int, ...]]]
    """(parameter, dtype, shape) -> how many of them store it so."""

    @classmethod
    def of(cls, members: tuple[int, ...], layers: Mapping[int, _Layer]) -> _PeerGroup:
        shapes: Counter[tuple[str, str, tuple[int, ...]]] = Counter()
        for j in members:
            shapes.update((n, d, s) for n, (d, s) in layers[j].shapes.items())
        names = frozenset().union(*(layers[j].names for j in members))
        return cls(members, names, shapes)


def _shape_problems(layer: _Layer, group: _PeerGroup) -> list[str]:
    """Parameters stored in the dtype their peers store them in, but in a shape none of them
    has (peers that store a parameter otherwise, quantized or not, are not compared)."""
    problems = []
    for name, (dtype, shape) in sorted(layer.shapes.items()):
        if group.shapes[(name, dtype, shape)] > 1:
            continue  # a peer stores it so too
        others = [
            (count, s)
            for (n, d, s), count in group.shapes.items()
            if n == name and d == dtype and s != shape
        ]
        if others:
            usual = max(others)[1]
            problems.append(f"{name} has shape {list(shape)} where its peers hold {list(usual)}")
    return problems


def _covered(
    layout: MainLayout, layers: Mapping[int, _Layer], peers: Mapping[_Kind, list[int]], cross: bool
) -> str:
    """What the PASS covers, in words: what was held to what, and what was not."""
    assert layout.layers is not None
    moe = [layer for layer in layers.values() if layer.experts]
    main = sum(len(members) for members in peers.values())
    parts = [f"{len(layers)} of {main} decoder layers present"]
    if moe:
        parts.append(f"{len(moe)} with all {max(len(x.experts) for x in moe)} routed experts")
    head = "embedding, final norm" + ("" if layout.tied else " and head") + " present"
    if not cross:
        tail = (
            "the config does not tell layer kinds apart, so layers were not held to each other "
            "tensor by tensor"
        )
        return f"{', '.join(parts)}; {head}; {tail}"
    alone = sum(1 for members in peers.values() if len(members) == 1)
    kinds = f"{len(peers)} kinds" if len(peers) > 1 else "one kind"
    tail = f"each layer held to the others of its kind ({kinds})"
    if alone:
        tail += f"; {alone} the only one of its kind, checked for presence and experts only"
    return f"{', '.join(parts)}; {head}; {tail}"


def sides_check(sides: list[tuple[str, Checkpoint, MtpAnalysis]]) -> CheckResult:
    """The main-model check of each labelled checkpoint (``diff``'s A and B) as one check,
    each finding's subject led by its side's label."""
    findings = tuple(
        Finding(f"{label}: {f.subject}", f.status, f.message, f.details)
        for label, ckpt, analysis in sides
        for f in main_model_check(ckpt, analysis).findings
    )
    return CheckResult(NAME, TITLE, findings)
