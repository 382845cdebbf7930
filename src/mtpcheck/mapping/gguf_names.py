"""How llama.cpp's ``convert_hf_to_gguf.py`` names and lays out an HF checkpoint's tensors.

The names are gguf-py's (``MODEL_TENSOR`` and ``TensorNameMap``) for the architectures below;
the layout changes and value transforms are the converter's (``conversion/glm.py``,
``deepseek.py``, ``qwen.py`` and ``base.py``), checked against :data:`CONVERTER`:

* per-expert matrices ``mlp.experts.{e}.{gate,up,down}_proj`` are stacked in expert order
  into one ``ffn_*_exps`` tensor ``[E, out, in]`` (GGUF lists dimensions innermost first, so
  the file says ``[in, out, E]``; the bytes are the experts' bytes in turn);
* Qwen3-Next and Qwen3.5 store every RMSNorm weight plus one (``norm.weight`` names except
  the gated-delta-net's ``linear_attn.norm``), added in float32 after widening BF16 sources;
* the Qwen MTP block ``mtp.*`` becomes block ``num_hidden_layers`` (``mtp.fc`` the nextn
  ``eh_proj``, ``mtp.pre_fc_norm_embedding`` / ``_hidden`` its ``enorm`` / ``hnorm``,
  ``mtp.norm`` its ``shared_head_norm``, ``mtp.layers.{i}`` block ``num_hidden_layers + i``);
* DeepSeek-V3 (``deepseek2``) is written without its MTP layer (``skip_mtp``; its ``--mtp``
  is "not supported for DeepseekV3ForCausalLM").

Tensors the converter re-lays out in other ways (DeepSeek's ``kv_b_proj`` split into
``attn_k_b`` / ``attn_v_b``, the gated-delta-net projections, ``A_log``) have no rule here:
a diff lists them as outside the mapping, never as compared.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

CONVERTER = "llama.cpp 0c1e57098 convert_hf_to_gguf.py, gguf-py 0.19.0"
"""The converter whose tables and transforms these rules were checked against."""

_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_ATTENTION = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}
_MLA = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
}
_MLP = {
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
}
_NEXTN = {
    "eh_proj.weight": "nextn.eh_proj.weight",
    "enorm.weight": "nextn.enorm.weight",
    "hnorm.weight": "nextn.hnorm.weight",
    "embed_tokens.weight": "nextn.embed_tokens.weight",
    "shared_head.head.weight": "nextn.shared_head_head.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight",
}
_QWEN_MTP = {
    "fc": "eh_proj",
    "pre_fc_norm_embedding": "enorm",
    "pre_fc_norm_hidden": "hnorm",
    "norm": "shared_head.norm",
}
"""Qwen3-Next / Qwen3.5 MTP names -> the DeepSeek-style names llama.cpp renames them to."""
_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


@dataclass(frozen=True)
class GgufArch:
    """One llama.cpp architecture as its converter writes it."""

    arch: str
    """``general.architecture``."""
    hf_architectures: tuple[str, ...]
    """HF ``architectures`` the converter registers for it."""
    layer: Mapping[str, str]
    """Name after ``model.layers.{k}.`` -> name after ``blk.{k}.``."""
    exports_mtp: bool = True
    """False where the converter writes the model without its MTP layer."""
    qwen_mtp: bool = False
    """MTP block under ``mtp.*`` (renamed, see :data:`_QWEN_MTP`)."""
    norms_plus_one: bool = False


def _layer(*tables: Mapping[str, str], post_norm: str) -> dict[str, str]:
    merged: dict[str, str] = {"post_attention_layernorm.weight": post_norm}
    for table in tables:
        merged |= table
    return merged


_POST = "post_attention_norm.weight"
ARCHES: tuple[GgufArch, ...] = (
    GgufArch("glm4moe", ("Glm4MoeForCausalLM",), _layer(_ATTENTION, _MLP, _NEXTN, post_norm=_POST)),
    GgufArch(
        "deepseek2",
        ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"),
        _layer(_MLA, _MLP, _NEXTN, post_norm="ffn_norm.weight"),
        exports_mtp=False,
    ),
    GgufArch(
        "qwen3next",
        ("Qwen3NextForCausalLM",),
        _layer(_ATTENTION, _MLP, _NEXTN, post_norm=_POST),
        qwen_mtp=True,
        norms_plus_one=True,
    ),
    GgufArch(
        "qwen35",
        ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
        _layer(_ATTENTION, _MLP, _NEXTN, post_norm=_POST),
        qwen_mtp=True,
        norms_plus_one=True,
    ),
)
BY_ARCH = {a.arch: a for a in ARCHES}


@dataclass(frozen=True)
class GgufTarget:
    """One GGUF tensor as computed from HF tensors."""

    name: str
    sources: tuple[str, ...]
    """HF names; several are stacked, in order, along a new first dimension."""
    plus_one: bool = False
    """Values are the sources' plus one, in float32."""


@dataclass(frozen=True)
class GgufPlan:
    """Every GGUF tensor a conversion keeping every tensor writes from the HF names given
    (an MTP layer the converter drops is planned all the same: the diff reports it missing),
    and the HF names no rule covers."""

    arch: GgufArch
    targets: dict[str, GgufTarget]
    unmapped: tuple[str, ...]


def _hf_layer_name(name: str, arch: GgufArch, hidden: int) -> str:
    """``name`` as the converter sees it after its renames (Qwen's ``mtp.*``)."""
    if not (arch.qwen_mtp and name.startswith(("mtp.", "model.mtp."))):
        return name
    parts = name.removeprefix("model.").split(".", 3)
    if len(parts) == 4 and parts[1] == "layers" and parts[2].isdecimal():
        return f"model.layers.{hidden + int(parts[2])}.{parts[3]}"
    if len(parts) == 3 and parts[1] in _QWEN_MTP:
        return f"model.layers.{hidden}.{_QWEN_MTP[parts[1]]}.{parts[2]}"
    return name


def plan_gguf(arch: GgufArch, hf_names: Iterable[str], hidden: int) -> GgufPlan:
    """The GGUF tensors ``arch``'s converter writes from ``hf_names`` (a model with ``hidden``
    main layers)."""
    targets: dict[str, GgufTarget] = {}
    experts: dict[str, dict[int, str]] = {}
    unmapped: list[str] = []
    for original in sorted(hf_names):
        name = _hf_layer_name(original, arch, hidden)
        plus = arch.norms_plus_one and name.endswith("norm.weight")
        plus = plus and not name.endswith("linear_attn.norm.weight")
        if name in _GLOBAL:
            targets[_GLOBAL[name]] = GgufTarget(_GLOBAL[name], (original,), plus)
            continue
        m = re.match(r"model\.layers\.(\d+)\.(.+)", name)
        if m is None:
            unmapped.append(original)
            continue
        block, rest = int(m.group(1)), m.group(2)
        expert = _EXPERT.fullmatch(rest)
        if expert is not None:
            target = f"blk.{block}.ffn_{expert.group(2)}_exps.weight"
            experts.setdefault(target, {})[int(expert.group(1))] = original
        elif rest in arch.layer:
            target = f"blk.{block}.{arch.layer[rest]}"
            targets[target] = GgufTarget(target, (original,), plus)
        else:
            unmapped.append(original)
    for target, by_index in experts.items():
        if sorted(by_index) == list(range(len(by_index))):
            targets[target] = GgufTarget(target, tuple(by_index[e] for e in sorted(by_index)))
        else:  # a gap in the experts: the converter would fail; nothing to stack
            unmapped.extend(by_index.values())
    return GgufPlan(arch, dict(sorted(targets.items())), tuple(sorted(unmapped)))


def arch_for(gguf_config: Mapping[str, Any]) -> GgufArch | None:
    """The mapped llama.cpp architecture a GGUF file's metadata names; None if unmapped."""
    arch = gguf_config.get("architecture")
    return BY_ARCH.get(arch) if isinstance(arch, str) else None


def mapped_arches() -> str:
    """The llama.cpp architectures with a name mapping, for error messages."""
    return ", ".join(a.arch for a in ARCHES)


_REWRITTEN = re.compile(
    r"blk\.\d+\.(attn_k_b|attn_v_b|attn_qkv|attn_gate|ssm_[a-z0-9_]+)(\.weight|\.bias)?"
)
"""GGUF tensors the converter computes from HF tensors in ways no rule here follows."""


def outside_gguf(names: Iterable[str]) -> tuple[str, ...]:
    """The GGUF ``names`` no rule here produces (they are not compared)."""
    return tuple(n for n in sorted(names) if _REWRITTEN.fullmatch(n))
