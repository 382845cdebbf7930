"""A main decoder layer's tensors as logical parameters: its routed experts folded into one
name a projection, the modules it is made of, and the shapes its stored values have (pure).

DeepSeek-V3 holds 92k tensors, 1,536 routed-expert tensors a layer: the experts are folded by
regular expressions over a layer's names at once, and layers of the same names are worked out
once; only a damaged layer is folded name by name, to say which expert lacks what.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from mtpcheck.model import Naming, TensorMeta
from mtpcheck.params import group

_GROUPED_EXPERT = re.compile(r"(experts\.linear_fc\d\.(?:weight|bias))(\d+)$", re.M)
"""Transformer Engine's grouped experts: ``mlp.experts.linear_fc1.weight{e}`` (one name, or
one a line in a layer's names joined)."""
MLP_BLOCKS = frozenset(
    {"mlp", "moe", "ffn", "block_sparse_moe", "feed_forward", "share_expert", "shared_mlp"}
)
"""Modules that are a layer's MLP (dense or MoE): they differ between dense and MoE layers."""
_ROUTED = re.compile(r"(?:^|\.)experts\.|_exps\.")


def is_routed_expert(name: str) -> bool:
    """A routed expert's tensor, one an expert or all stacked in one, in HF and Megatron names
    (``mlp.experts.3.up_proj``, ``mlp.experts.gate_up_proj``, ``mlp.experts.linear_fc1``) and
    llama.cpp's (``ffn_up_exps.weight``); not a shared expert's (``shared_experts``)."""
    return _ROUTED.search(name) is not None


@dataclass(frozen=True)
class MainLayer:
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
    stacked: bool = False
    """It holds a tensor of every routed expert stacked, ``[experts, ...]`` (Step's
    ``moe.gate_proj.weight``, whose name does not say so)."""

    @property
    def routed(self) -> bool:
        """It holds routed experts, one tensor each or stacked."""
        return bool(self.experts) or self.stacked or any(map(is_routed_expert, self.names))


def expert_of(rel: str) -> tuple[str, int, str] | None:
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
    m = _GROUPED_EXPERT.search(rel) if rel[-1:].isdigit() else None
    if m is not None:
        return f"{rel[: m.start(2)]}*", int(m.group(2)), m.group(1).rsplit(".", 2)[-2]
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
        found = expert_of(rel)
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


def _fold_fast(rels: frozenset[str]) -> _Folded | None:
    """The routed experts of a layer folded by regular expressions over all its names at once
    (C speed: DeepSeek-V3 has 92k names), where every expert holds the same parameters; None
    where they do not (a damaged layer, folded name by name to say which lacks what)."""
    joined = "\n".join(rels)
    indices = _EXPERT_INDEX.findall(joined)
    if indices:
        joined = _EXPERT_INDEX.sub("experts.*.", joined)
    if "experts.linear_fc" in joined:  # rare: a template replacement, not a literal
        indices += [i for _, i in _GROUPED_EXPERT.findall(joined)]
        joined = _GROUPED_EXPERT.sub(r"\1*", joined)
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


def read_layer(
    prefix: str,
    rels: frozenset[str],
    tensors: Mapping[str, TensorMeta],
    naming: Naming,
    experts: int | None = None,
) -> MainLayer:
    """One layer's tensors as logical parameters, with the shapes its stored values have;
    ``experts``: the routed experts an MoE layer has, which a stacked tensor leads with."""
    structure, stored = _structure(rels, naming)
    shapes: dict[str, tuple[str, tuple[int, ...]]] = {}
    for logical, values in stored.items():
        meta = tensors.get(prefix + values)
        if meta is not None:
            shapes[logical] = (meta.dtype, tuple(meta.shape))
    stacked = bool(experts) and any(len(s) == 3 and s[0] == experts for _, s in shapes.values())
    return replace(structure, shapes=shapes, stacked=stacked)


def layer_names(rels: frozenset[str], naming: Naming = Naming.HF) -> frozenset[str]:
    """A layer's parameters as the checks name them (logical, a routed expert's index
    ``*``), from its tensor names relative to its prefix."""
    return _structure(rels, naming)[0].names


@functools.lru_cache(maxsize=16)
def _structure(rels: frozenset[str], naming: Naming) -> tuple[MainLayer, Mapping[str, str]]:
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
    return MainLayer(frozenset(names), frozen, {}, count, blocks, grouped), stored
