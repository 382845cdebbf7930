"""Is the main model whole? Every decoder layer the config declares, each holding what its
kind holds, every routed expert, the embedding, the final norm and the head (pure).

Exports that lose MTP layers lose main weights with them (a shard left out, a layer short, a
layer's routed experts dropped by a merge), and the MTP checks cannot see that. What a layer
must hold is read from two places: the config (how many layers, the kind of each, the routed
experts of an MoE layer, a tied head: :mod:`mtpcheck.families.main_layout`) and the other
layers of the same kind in the same checkpoint (their tensor names and shapes). Names are
compared as logical parameters, so a quantized weight with its scales is one tensor, in any
format's names (HF, Megatron, GGUF). A layer that is the only one of its kind is held, module
by module, to layers differing from it only in their MLP and to the MTP blocks that mirror it;
its MLP may then be held to nothing, which the PASS line says.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtpcheck.checks.definition_checks import Held, definition_problems, unknown_finding
from mtpcheck.checks.main_layers import MLP_BLOCKS, MainLayer, read_layer
from mtpcheck.dtypes import is_high_precision
from mtpcheck.families import MtpAnalysis, MtpFamily, hidden_layer_count
from mtpcheck.families.definitions import Definition, definition_of
from mtpcheck.families.main_layout import MainLayout, main_layout
from mtpcheck.families.name_templates import LayerNames, NameTemplate
from mtpcheck.model import (
    CheckName,
    Checkpoint,
    CheckResult,
    Finding,
    MainModelElsewhere,
    Naming,
    Status,
    TensorMeta,
)
from mtpcheck.model.config_keys import is_int, text_value
from mtpcheck.params import stored_forms
from mtpcheck.units import first_few

NAME = CheckName.MAIN_MODEL
TITLE = "Main model held to its config"

_MLP_FACTS = frozenset({"mlp", "mlp_layer_types", "routed experts"})
"""Kind facts about the MLP alone: layers differing only there share their other modules."""
_Kind = tuple[tuple[str, str], ...]
"""A layer's kind: (fact, value) pairs."""


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
        (family.layout.main_shared[0], "the embedding"),
        (family.layout.main_norm, "the final norm"),
    ]
    if not layout.tied and len(family.layout.main_shared) > 1:
        head = family.layout.main_shared[1]
        wanted.append((head, "the output head (the config does not tie it)"))
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
    inside = _mtp_layer_numbers(analysis, hidden_layer_count(family, config))
    layout = main_layout(family, config, len(inside), analysis.declared.value or 0)
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
    layers = _main_layers(family, layout, tensors, names, naming, inside)
    cross = _cross_checks(layout, naming)
    peers = _peers(layout, layers, inside, cross)
    mirrored = _mirrored(analysis, tensors, names, naming)
    norms_alike = naming is Naming.HF
    definition = definition_of(family.key) if naming is Naming.HF else None
    held = None
    if definition is not None:
        template = NameTemplate(family.layout.main_layer_prefix)
        prefixes = {k: template.main_layer(k) for k in layers}
        held = definition_problems(definition, layers, prefixes, layout.moe_layers)
    findings += _layer_findings(layout, layers, peers, mirrored, norms_alike, held)
    if definition is not None and held is not None:
        unknown = unknown_finding(definition, held, prefixes)
        findings += [unknown] if unknown is not None else []
    if not any(f.status is Status.FAIL for f in findings):
        covered = _covered(layout, layers, peers, cross, definition, held)
        findings.append(Finding("main model", Status.PASS, covered))
    return CheckResult(NAME, TITLE, tuple(findings))


def _main_layers(
    family: MtpFamily,
    layout: MainLayout,
    tensors: Mapping[str, TensorMeta],
    names: list[str],
    naming: Naming,
    inside: set[int],
) -> dict[int, MainLayer]:
    """Main layers 0 .. layers - 1 that hold a tensor, leaving out the MTP layers ``inside``
    the main layers' numbering (Ling-V2 counts its MTP layer in ``num_hidden_layers``)."""
    assert layout.layers is not None
    template = NameTemplate(family.layout.main_layer_prefix)
    by_layer = LayerNames(names, template.text, layout.layers)
    found = {}
    for k in by_layer:
        if k not in inside:
            prefix = template.main_layer(k)
            found[k] = read_layer(prefix, by_layer[k], tensors, naming, layout.experts)
    return found


def _cross_checks(layout: MainLayout, naming: Naming) -> bool:
    """Whether layers the config does not tell apart hold the same tensors: where it lists
    layer kinds, and in HF names (transformers builds every layer from the config, so a hybrid
    stack's config says which layer is which). Megatron's and llama.cpp's metadata may not."""
    return any(layout.kinds) or naming is Naming.HF


def _peers(
    layout: MainLayout, layers: Mapping[int, MainLayer], inside: set[int], cross: bool
) -> dict[_Kind, list[int]]:
    """Main layers by kind (leaving out the MTP layers ``inside`` their numbering); without
    ``cross``, each layer a kind of its own."""
    assert layout.layers is not None
    # a layer that is gone is taken to be MoE or dense as most layers the config calls alike
    usual: dict[_Kind, Counter[bool]] = {}
    for k, layer in layers.items():
        usual.setdefault(_kind_key(layout, k, None), Counter())[layer.routed] += 1
    peers: dict[_Kind, list[int]] = {}
    for k in range(layout.layers):
        if k in inside:
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
    layers: Mapping[int, MainLayer],
    peers: Mapping[_Kind, list[int]],
    mirrored: Mapping[int, list[tuple[str, MainLayer]]],
    norms_alike: bool,
    held: Held | None,
) -> list[Finding]:
    """One finding per damaged main layer. ``mirrored``: the MTP blocks that
    mirror a main layer, by its number; ``norms_alike``: every decoder layer has the same
    norms whatever its kind (transformers' layers; megatron-core's hybrid stack names a
    Mamba, an attention and an MLP layer's norm each its own way); ``held``: the layers held to
    their family's definition, whose findings stand before what the peers add."""
    findings = []
    groups: dict[tuple[frozenset[str], tuple[int, ...]], _PeerGroup] = {}
    for kind, kind_layers in peers.items():
        others = [j for other, js in peers.items() if _same_besides_mlp(kind, other) for j in js]
        if norms_alike and not any(key == "layer" for key, _ in kind):
            everyone = [j for js in peers.values() for j in js]
        else:  # each kind its norms, or kinds the config does not tell apart
            everyone = others
        for k in kind_layers:
            told = held.told(k) if held is not None else frozenset()
            defined = [held.problems[k]] if held is not None and k in held.problems else []
            problems = _layer_problems(k, layout, layers, kind_layers, groups, told, defined)
            if not problems and len(kind_layers) == 1:
                problems = _block_problems(k, layers, others, everyone, mirrored.get(k, []), told)
            problems = defined + problems
            if problems:
                words = layout.kind_words(k)
                subject = f"main layer {k}" + (f" ({words})" if words else "")
                findings.append(Finding(subject, Status.FAIL, "; ".join(problems)))
    return sorted(findings, key=lambda f: int(f.subject.split()[2]))


def _mtp_layer_numbers(analysis: MtpAnalysis, layers: int | None) -> set[int]:
    """Layer numbers below ``layers`` (the config's decoder layers) that hold MTP layers under
    the main layers' prefix: Ling-V2's remote code counts its MTP layer as a hidden layer."""
    family = analysis.family
    assert family is not None
    head, _ = NameTemplate(family.layout.main_layer_prefix).around("k")
    found = set()
    for layer in analysis.layers:
        if layer.prefix.startswith(head):
            number = layer.prefix[len(head) :].split(".", 1)[0]
            if number.isdigit() and layers is not None and int(number) < layers:
                found.add(int(number))
    return found


def _layers_named(layers: list[int]) -> str:
    named = first_few(layers, 3, counted=False)
    return ("main layer " if len(layers) == 1 else "main layers ") + named


def _layer_problems(
    k: int,
    layout: MainLayout,
    layers: Mapping[int, MainLayer],
    kind_layers: list[int],
    groups: dict[tuple[frozenset[str], tuple[int, ...]], _PeerGroup],
    told: frozenset[str] = frozenset(),
    defined: list[str] | None = None,
) -> list[str]:
    """What layer ``k`` lacks against the other present layers of its kind (``kind_layers``):
    those built of the same modules are its peers, name for name and shape for shape; a layer
    built of fewer modules than two or more others, alone in that, lost the rest. ``told``:
    parameters left out (its definition named them, or none holds them); ``defined``: what
    its definition says it lacks, which then stands for a lost module too."""
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
    lacking = sorted(group.names - layer.names - told) if peers else []
    if lacking:
        problems.append(
            f"{len(lacking)} tensor(s) of its kind missing (as {_layers_named(peers)} "
            f"{'holds' if len(peers) == 1 else 'hold'} them): {first_few(lacking, 4)}"
        )
    if not peers and any(layout.kinds) and not defined:
        # only where the config tells kinds apart: a hybrid stack it does not describe
        # (llama.cpp's metadata) mixes layers of other modules in one kind
        problems += _lost_blocks(layer, layers, present)
    problems += _expert_problems(k, layout, layer)
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
    layers: Mapping[int, MainLayer],
    others: list[int],
    everyone: list[int],
    blocks: list[tuple[str, MainLayer]],
    told: frozenset[str] = frozenset(),
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
        if block in MLP_BLOCKS:
            continue
        pool = everyone if not block else others
        holders = [j for j in pool if j != k and j in layers and block in layers[j].by_block]
        if not holders:
            continue
        union = frozenset().union(*(layers[j].by_block[block] for j in holders))
        lacking = sorted(union - layer.by_block[block] - told)
        if lacking:
            where = f"its {block}" if block else "the layer's own"
            problems.append(
                f"{len(lacking)} tensor(s) of {where} missing (as {_layers_named(holders)} "
                f"{'holds' if len(holders) == 1 else 'hold'} them): {first_few(lacking, 4)}"
            )
    return problems


def _against_blocks(layer: MainLayer, blocks: list[tuple[str, MainLayer]]) -> list[str]:
    """The layer's modules against those of the MTP blocks mirroring it, module by module for
    the modules both hold (an MTP block's own norms and projection are no module of a main
    layer); an MLP only where both store routed experts alike (Qwen3.5 packs them in one and
    not the other, by design)."""
    problems = []
    for block in sorted(b for b in layer.by_block if b):
        alike = [(p, b) for p, b in blocks if block in b.by_block]
        if block in MLP_BLOCKS:
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
                f"mirroring it holds them): {first_few(lacking, 4)}"
            )
    return problems


def _mirrored(
    analysis: MtpAnalysis, tensors: Mapping[str, TensorMeta], names: list[str], naming: Naming
) -> dict[int, list[tuple[str, MainLayer]]]:
    """Main layer number -> the MTP blocks mirroring it (prefix, their tensors)."""
    family = analysis.family
    assert family is not None
    head, tail = NameTemplate(family.layout.main_layer_prefix).around("k")
    found: dict[int, list[tuple[str, MainLayer]]] = {}
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
        block = read_layer(block_prefix, frozenset(rels), tensors, naming)
        found.setdefault(int(number), []).append((block_prefix, block))
    return found


def _lost_blocks(
    layer: MainLayer, layers: Mapping[int, MainLayer], present: list[int]
) -> list[str]:
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


def _expert_problems(k: int, layout: MainLayout, layer: MainLayer) -> list[str]:
    """Every routed expert 0 .. experts - 1, each with the parameters the others hold; and a
    layer the config makes MoE holds routed experts, one tensor each or stacked (mergekit's
    ``mergekit-yaml`` keeps a DeepSeek MoE layer's router and shared expert, not them)."""
    if not layer.experts:
        moe = layout.moe_layers is not None and k in layout.moe_layers
        if moe and layout.experts and not layer.routed:
            return [f"no routed experts: the config makes it an MoE layer of {layout.experts}"]
        return []
    held = sorted(layer.experts)
    count = layout.experts if layout.experts and held[-1] < layout.experts else held[-1] + 1
    missing = [e for e in range(count) if e not in layer.experts]
    parts = frozenset().union(*layer.experts.values())
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of {count} routed experts missing: expert(s) "
            + first_few([str(e) for e in missing], 8)
        )
    lacking: dict[frozenset[str], list[str]] = {}  # once per distinct set: experts share one
    for e in held:
        owns = layer.experts[e]
        lacks = lacking.get(owns)
        if lacks is None:
            lacks = lacking[owns] = sorted(parts - owns)
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
    def of(cls, members: tuple[int, ...], layers: Mapping[int, MainLayer]) -> _PeerGroup:
        shapes: Counter[tuple[str, str, tuple[int, ...]]] = Counter()
        for j in members:
            shapes.update((n, d, s) for n, (d, s) in layers[j].shapes.items())
        names = frozenset().union(*(layers[j].names for j in members))
        return cls(members, names, shapes)


def _shape_problems(layer: MainLayer, group: _PeerGroup) -> list[str]:
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
    layout: MainLayout,
    layers: Mapping[int, MainLayer],
    peers: Mapping[_Kind, list[int]],
    cross: bool,
    definition: Definition | None = None,
    held: Held | None = None,
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
    described = held.described if held is not None else frozenset()
    if definition is not None and described:
        built = " / ".join(definition.built_by)
        which = "" if len(described) == len(layers) else f" ({len(described)} of them)"
        tail += f" and to {definition.source}'s {built}{which}"
        alone = sum(1 for ms in peers.values() if len(ms) == 1 and ms[0] not in described)
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
