"""The MTP head of a checkpoint, built from the main model's own transformers modules.

For a DeepSeek-style MTP layer (DeepSeek-V3, GLM-4.5; Qwen3-Next's ``mtp.fc`` over
``pre_fc_norm_embedding`` / ``pre_fc_norm_hidden`` is the same shape) with hidden state ``h_t``
of the main model and the embedding ``e_{t+1}`` of the next token::

    x = eh_proj(cat(enorm(e_{t+1}), hnorm(h_t)))      # hidden first for MiMo-style layouts
    x = decoder_block(x)                               # the main model's decoder-layer class
    logits = head(final_norm(x))                       # shared_head.{norm, head}

``h_t`` is the main model's last hidden state **after** its final norm: transformers' MTP
candidate generator feeds ``hidden_states[-1]``, which its output capturing ties to
``last_hidden_state`` (post-norm), and vLLM's DeepSeek MTP proposer is fed the target model's
returned (normed) hidden states the same way. The embedding and output head are the stored
copies in the MTP layer when the checkpoint has them (what a serving engine loads), else the
main model's. The decoder block's slot t sits at position t (as in vLLM and Megatron-LM);
RoPE attention only sees position differences, so this equals transformers' t+1 convention.
Where the config lists a kind per layer (Qwen3-Next's linear or full attention), the block is
built with the kinds of the main layer it mirrors.

With several MTP layers (Step-3.7 ships 3) depth d+1 takes depth d's hidden state and the
token after the one depth d drafted; which hidden state (after the layer's final norm or
before it) is the family's ``chain_hidden``, the rule of the engine that serves it. Each depth
uses its layer's own output head where the family stores one (``head_output``).

Weights are read with mtpcheck's own checkpoint reader, by the family registry's names, and
mapped onto the modules' parameters (per-expert MoE tensors are stacked into transformers'
fused ``gate_up_proj`` / ``down_proj`` when the module is fused). Every tensor of the MTP
layer must be used and every parameter filled, or the head is refused.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any, cast

import torch

from mtpcheck.dtypes import torch_name
from mtpcheck.errors import InputError
from mtpcheck.families import ChainHidden, ConcatOrder, Drafter, MtpAnalysis, fill_template
from mtpcheck.model import Checkpoint, read_whole
from mtpcheck.params import FUSED_EXPERTS

_FLOAT_DTYPES = {code: getattr(torch, torch_name(code)) for code in ("BF16", "F16", "F32")}
"""The MTP weight types accept builds a head from."""


@dataclass(frozen=True)
class HeadLayout:
    """Where MTP layer 0's tensors live in one checkpoint."""

    family: str
    prefix: str
    """Prefix of the MTP decoder block, e.g. ``model.layers.61.``."""
    enorm: str
    hnorm: str
    projection: str
    final_norm: str
    embed: str | None
    """Stored copy of the embedding in the MTP layer, when present."""
    head: str | None
    """Stored output head of the MTP layer, when present."""
    hidden_first: bool
    mirrors: int | None = None
    """The main decoder layer the MTP block mirrors (its attention and MLP kinds are the
    block's, for models whose config lists a kind per layer)."""
    depth: int = 0
    """0-based MTP depth (the config's ``mtp_layer_types[depth]`` names the block's kinds)."""
    chain_hidden: ChainHidden = ChainHidden.POST_NORM


def supported_names() -> str:
    """The families ``accept`` can measure, for its refusals."""
    from mtpcheck.families import FAMILIES

    return ", ".join(f.display for f in FAMILIES if f.support.accept.measurable)


def missing_drafter(analysis: MtpAnalysis) -> str | None:
    """Why the checkpoint holds no drafter an engine could run (no complete MTP layer 0),
    or None when it holds one."""
    present = [layer for layer in analysis.layers if layer.present]
    family = analysis.family
    if family is not None and family.drafter is not Drafter.INSIDE:
        why = family.support.accept.why_not
        return why or "no MTP layers: the drafter is a separate checkpoint"
    if not present:
        declared = analysis.declared.value
        said = f"; config declares {declared} ({analysis.declared.source})" if declared else ""
        return f"no MTP weights in the checkpoint{said}"
    first = min(present, key=lambda layer: layer.index)
    if first.index != 0 or first.missing:
        shown = ", ".join(first.missing[:3])
        return (
            f"MTP layer {first.index} is incomplete: {len(first.missing)} tensor(s) missing "
            f"({shown})"
        )
    return None


def drafter_layouts(
    ckpt: Checkpoint, analysis: MtpAnalysis, chain: ChainHidden | None = None
) -> tuple[HeadLayout, ...] | str:
    """The layouts of MTP layers 0, 1, ... (as deep as they are complete), or why the
    checkpoint has no drafter.

    A checkpoint without a complete MTP layer 0 has no drafter (a string says why); one whose
    family ``accept`` cannot run raises :class:`InputError`. ``chain`` overrides the family's
    rule for what depth d passes to depth d+1.
    """
    why = missing_drafter(analysis)
    if why is not None:
        return why
    present = [layer for layer in analysis.layers if layer.present]
    family = analysis.family
    parts = family and family.layout.head_parts
    if family is None or not family.support.accept.measurable or not parts:
        name = family.display if family else f"model_type {analysis.model_type!r}"
        why = family.support.accept.why_not if family else ""
        raise InputError(
            ckpt.path,
            f"accept does not support {name} yet"
            + (f": {why}" if why else "")
            + f" (supported: {supported_names()})",
        )
    complete = {layer.index for layer in present if not layer.missing}
    depths = 0
    while depths in complete:
        depths += 1
    base = analysis.num_hidden_layers or 0
    layouts = []
    for i in range(depths):
        layer = next(layer for layer in present if layer.index == i)
        for name in layer.present:
            dtype = ckpt.tensors[name].dtype
            if dtype not in _FLOAT_DTYPES and not name.endswith("e_score_correction_bias"):
                raise InputError(
                    ckpt.path,
                    f"{name} is {dtype}: accept supports BF16/F16/F32 MTP weights only "
                    "(quantised MTP layers not yet)",
                )
        enorm, hnorm, projection, final_norm = (fill_template(t, i, base) for t in parts)
        copies = {c.main: fill_template(c.template, i, base) for c in family.layout.copies}
        main_embed, main_head = family.layout.main_shared
        embed = copies.get(main_embed)
        own = family.layout.head_output
        head = fill_template(own, i, base) if own else None
        head = head or copies.get(main_head)
        layouts.append(
            HeadLayout(
                family=family.key,
                prefix=fill_template(family.layout.layer_prefix, i, base),
                enorm=enorm,
                hnorm=hnorm,
                projection=projection,
                final_norm=final_norm,
                embed=embed if embed in ckpt.tensors else None,
                head=head if head in ckpt.tensors else None,
                hidden_first=family.layout.concat_order is ConcatOrder.HIDDEN_FIRST,
                mirrors=_layer_number(analysis.reference_layers.get(i)),
                depth=i,
                chain_hidden=chain or family.serving.chain_hidden,
            )
        )
    return tuple(layouts)


def _layer_number(prefix: str | None) -> int | None:
    """``model.layers.7.`` -> 7."""
    digits = [part for part in (prefix or "").split(".") if part.isdigit()]
    return int(digits[-1]) if digits else None


def read_tensor(ckpt: Checkpoint, name: str) -> torch.Tensor:
    """A checkpoint tensor as a CPU torch tensor of its stored dtype, via mtpcheck's reader."""
    meta = ckpt.tensors[name]
    dtype = _FLOAT_DTYPES.get(meta.dtype)
    if dtype is None:
        raise InputError(meta.file, f"{name}: dtype {meta.dtype} is not supported by accept")
    buf = read_whole(ckpt, name)
    flat = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(meta.shape)


def causal_mask(
    length: int, dtype: torch.dtype, device: torch.device, window: int | None = None
) -> torch.Tensor:
    """Additive ``[1, 1, L, L]`` causal mask: 0 on and below the diagonal; with a sliding
    ``window``, only the last ``window`` positions (the query's own included) are seen, as
    transformers' ``sliding_window_overlay`` has it."""
    mask = torch.full((length, length), torch.finfo(dtype).min, dtype=dtype, device=device)
    mask = mask.triu(1)
    if window is not None:
        mask = mask + torch.full_like(mask, torch.finfo(dtype).min).tril(-window)
        mask = mask.clamp(min=torch.finfo(dtype).min)
    return mask[None, None]


class MtpHead(torch.nn.Module):
    """One MTP layer plus its output head: ``(h_t, token_{t+1}) -> logits for token_{t+2}``."""

    def __init__(
        self,
        enorm: torch.nn.Module,
        hnorm: torch.nn.Module,
        projection: torch.nn.Linear,
        block: torch.nn.Module,
        final_norm: torch.nn.Module,
        embed: torch.nn.Module,
        head: torch.nn.Module,
        rotary: torch.nn.Module | None,
        hidden_first: bool,
        window: int | None = None,
        layer_type: str | None = None,
    ) -> None:
        super().__init__()
        self.window = window
        """Sliding-attention window of the block, None for full attention."""
        self.layer_type = layer_type
        """Passed to rotary embeddings that keep parameters per layer kind (Step-3.7)."""
        self.enorm = enorm
        self.hnorm = hnorm
        self.eh_proj = projection
        self.block = block
        self.final_norm = final_norm
        self.embed = embed
        self.head = head
        self.rotary = rotary
        self.hidden_first = hidden_first

    def forward(self, hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """``hidden[:, t]`` and ``next_ids[:, t]`` (token t+1) -> logits for token t+2."""
        logits: torch.Tensor = self.head(self.final_norm(self.block_output(hidden, next_ids)))
        return logits

    def block_output(self, hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """The decoder block's output, before the final norm."""
        x = self.project(hidden, next_ids)
        length = x.shape[1]
        positions = torch.arange(length, device=x.device)[None].expand(x.shape[0], -1)
        return self.run_block(x, positions, causal_mask(length, x.dtype, x.device, self.window))

    def project(
        self,
        hidden: torch.Tensor,
        next_ids: torch.Tensor,
        embed: torch.nn.Module | None = None,
        zeroed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The block's input: ``eh_proj`` over the normed token embedding (by ``embed``, else
        the head's own; zero where ``zeroed`` is true) and the normed state."""
        # under a device map the main model's embedding and hidden state may live elsewhere
        here = self.eh_proj.weight.device
        e = (embed or self.embed)(next_ids).to(device=here, dtype=hidden.dtype)
        if zeroed is not None:
            e = torch.where(zeroed[..., None].to(here), torch.zeros_like(e), e)
        e = self.enorm(e)
        h = self.hnorm(hidden.to(here))
        x: torch.Tensor = self.eh_proj(torch.cat([h, e] if self.hidden_first else [e, h], dim=-1))
        return x

    def run_block(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The decoder block over inputs ``x`` at ``positions`` (``[B, L]``) under ``mask``."""
        rope = None
        if self.rotary is not None:
            kinds = {"layer_type": self.layer_type} if self.layer_type else {}
            rope = self.rotary(x, positions, **kinds)
        out = self.block(x, attention_mask=mask, position_ids=positions, position_embeddings=rope)
        if isinstance(out, tuple):  # older transformers decoder layers return tuples
            out = out[0]
        block_out: torch.Tensor = out
        return block_out


class MtpChain(torch.nn.Module):
    """The MTP layers of a checkpoint, depth 1 to D, chained as its serving engine does.

    Teacher-forced over a sequence ``x_0..x_{L-1}`` with main hidden states ``h``: depth j
    (1-based) at slot t takes the state depth j-1 left at slot t (``h_t`` for j = 1) and
    token ``x_{t+j}``, and drafts token ``x_{t+j+1}``; it has slots ``0..L-1-j``.
    """

    def __init__(self, heads: list[MtpHead], chain_hidden: ChainHidden) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleList(heads)
        self.chain_hidden = chain_hidden

    @property
    def depths(self) -> int:
        """How many MTP layers are chained (D)."""
        return len(self.heads)

    @property
    def layers(self) -> tuple[MtpHead, ...]:
        """The chained layers, depth 1 first, typed as what they are."""
        return tuple(cast(MtpHead, head) for head in self.heads)

    def step(
        self, depth: int, state: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One depth (1-based): (logits, the state depth + 1 takes) at every slot given."""
        head = cast(MtpHead, self.heads[depth - 1])
        out = head.block_output(state, tokens)
        normed = head.final_norm(out)
        passed = normed if self.chain_hidden is ChainHidden.POST_NORM else out
        logits: torch.Tensor = head.head(normed).to(out.device)
        return logits, passed

    def forward(
        self, hidden: torch.Tensor, ids: torch.Tensor, depths: int | None = None
    ) -> list[torch.Tensor]:
        """Logits of depths 1..``depths`` (all by default); depth j's has ``L - j`` slots."""
        length = ids.shape[1]
        state = hidden
        logits = []
        for j in range(1, (depths or self.depths) + 1):
            if length - j < 1:
                break
            q, state = self.step(j, state[:, : length - j], ids[:, j:])
            logits.append(q)
        return logits


def _block_state(
    ckpt: Checkpoint, layout: HeadLayout, block: torch.nn.Module, skip: set[str]
) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Checkpoint tensors for the block's parameters, and the checkpoint names used."""
    available = {
        name[len(layout.prefix) :]: name
        for name in ckpt.tensors
        if name.startswith(layout.prefix) and name not in skip
    }
    state: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for key, target in block.state_dict(keep_vars=True).items():
        if key in available:
            state[key] = read_tensor(ckpt, available[key])
            used.add(available[key])
            continue
        stem, _, leaf = key.rpartition(".")
        parts = FUSED_EXPERTS.get(f"mlp.experts.{leaf}") if stem.endswith("experts") else None
        if parts:
            experts = []
            for e in range(target.shape[0]):
                names = [available.get(f"{stem}.{e}.{part}.weight") for part in parts]
                if any(n is None for n in names):
                    break
                found = [n for n in names if n is not None]
                experts.append(torch.cat([read_tensor(ckpt, n) for n in found], dim=0))
                used.update(n for n in names if n is not None)
            else:
                state[key] = torch.stack(experts)
                continue
        raise InputError(
            ckpt.path, f"MTP block has no tensor for {layout.prefix}{key} (transformers {key!r})"
        )
    unused = sorted(set(available.values()) - used)
    if unused:
        raise InputError(
            ckpt.path,
            f"{len(unused)} MTP tensor(s) have no place in the transformers decoder layer: "
            + ", ".join(unused[:3]),
        )
    return state, used


def _check_shape(ckpt: Checkpoint, name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise InputError(
            ckpt.path, f"{name} has shape {list(tensor.shape)}, expected {list(shape)}"
        )


def _block_config(model: Any, ckpt: Checkpoint, layout: HeadLayout, skip: set[str]) -> Any:
    """A one-layer copy of the main model's text config for the MTP block: its own layer
    kinds (or those of the main layer it mirrors), dense or MoE as its tensors are."""
    config = copy.deepcopy(model.config.get_text_config())
    block_names = [n for n in ckpt.tensors if n.startswith(layout.prefix) and n not in skip]
    moe = any(".experts." in n or ".mlp.gate.weight" in n for n in block_names)
    k = layout.mirrors
    for kinds in ("layer_types", "mlp_layer_types"):  # per-layer kinds: the MTP layer's own
        listed = getattr(config, kinds, None)  # where the config lists them, else the mirrored
        own = getattr(config, f"mtp_{kinds}", None)  # main layer's
        if isinstance(own, list | tuple) and layout.depth < len(own):
            setattr(config, kinds, [own[layout.depth]])
        elif isinstance(listed, list | tuple) and k is not None and k < len(listed):
            setattr(config, kinds, [listed[k]])
    config.num_hidden_layers = 1
    if hasattr(config, "first_k_dense_replace"):
        config.first_k_dense_replace = 0 if moe else 1
    if getattr(config, "_attn_implementation", None) not in ("eager", "sdpa"):
        config._attn_implementation = "sdpa"
    return config


def _loaded_block(
    model: Any,
    config: Any,
    ckpt: Checkpoint,
    layout: HeadLayout,
    skip: set[str],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.nn.Module:
    """The main model's decoder-layer class built from ``config``, loaded with the MTP
    block's tensors (what the model class keeps in float32 stays so)."""
    layer_cls = type(model.get_decoder().layers[-1])
    with torch.device("meta"):
        block: torch.nn.Module = layer_cls(config, 0)
    state, _ = _block_state(ckpt, layout, block, skip)
    keep32 = _keep_in_fp32(model) if dtype != torch.float32 else ()
    block.load_state_dict(
        {k: v.to(device=device, dtype=_param_dtype(k, v, dtype, keep32)) for k, v in state.items()},
        strict=True,
        assign=True,
    )
    return block


def _loaded_linear(
    weight: torch.Tensor, device: torch.device, dtype: torch.dtype
) -> torch.nn.Linear:
    """A bias-free linear layer holding ``weight`` (``[out, in]``)."""
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.load_state_dict({"weight": weight.to(device=device, dtype=dtype)}, assign=True)
    return linear


def _embed_and_head(
    model: Any, ckpt: Checkpoint, layout: HeadLayout, dtype: torch.dtype, device: torch.device
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The embedding and output head the head drafts through: the MTP layer's stored copies
    where it has them, else the main model's."""
    embed: torch.nn.Module = model.get_input_embeddings()
    if layout.embed is not None:
        weight = read_tensor(ckpt, layout.embed)
        _check_shape(ckpt, layout.embed, weight, tuple(model.get_input_embeddings().weight.shape))
        embed = torch.nn.Embedding.from_pretrained(weight.to(device=device, dtype=dtype))  # type: ignore[no-untyped-call]
    head: torch.nn.Module = model.get_output_embeddings()
    if layout.head is not None:
        weight = read_tensor(ckpt, layout.head)
        _check_shape(ckpt, layout.head, weight, tuple(model.get_output_embeddings().weight.shape))
        head = _loaded_linear(weight, device, dtype)
    return embed, head


def _norm(
    model: Any, config: Any, ckpt: Checkpoint, name: str, dtype: torch.dtype, device: torch.device
) -> torch.nn.Module:
    """The main model's norm class holding the checkpoint's ``name``."""
    hidden = int(config.hidden_size)
    weight = read_tensor(ckpt, name)
    _check_shape(ckpt, name, weight, (hidden,))
    with torch.device("meta"):
        module: torch.nn.Module = type(model.get_decoder().norm)(
            hidden, eps=float(config.rms_norm_eps)
        )
    module.load_state_dict({"weight": weight.to(device=device, dtype=dtype)}, assign=True)
    return module


def _rotary(decoder: Any, config: Any) -> tuple[torch.nn.Module | None, int | None, str | None]:
    """The main model's rotary embedding, the block's sliding window (None: full attention)
    and the layer kind to pass to a rotary embedding that keeps parameters per kind."""
    rotary = getattr(decoder, "rotary_emb", None)
    kinds = getattr(config, "layer_types", None)
    kind = kinds[0] if isinstance(kinds, list | tuple) and kinds else None
    per_kind = rotary is not None and "layer_type" in inspect.signature(rotary.forward).parameters
    sliding = kind == "sliding_attention"
    window = int(config.sliding_window) if sliding and config.sliding_window else None
    return rotary, window, kind if per_kind else None


def _refuse_unloaded(model: Any, module: MtpHead) -> None:
    """Every parameter of the head is filled, except the main model's shared embedding and
    head, which may be offloaded (meta until accelerate loads them)."""
    shared = {
        id(t)
        for m in (model.get_input_embeddings(), model.get_output_embeddings())
        for t in (*m.parameters(), *m.buffers())
    }
    left = [
        n
        for n, t in (*module.named_parameters(), *module.named_buffers())
        if t.is_meta and id(t) not in shared
    ]
    if left:
        raise RuntimeError(f"MTP head parameters left unloaded: {left[:3]}")


def build_head(
    model: Any, ckpt: Checkpoint, layout: HeadLayout, dtype: torch.dtype, device: torch.device
) -> MtpHead:
    """The MTP head of ``ckpt`` using ``model``'s decoder-layer, norm and rotary classes."""
    skip = {layout.enorm, layout.hnorm, layout.projection, layout.final_norm}
    skip |= {n for n in (layout.embed, layout.head) if n}
    config = _block_config(model, ckpt, layout, skip)
    block = _loaded_block(model, config, ckpt, layout, skip, dtype, device)
    hidden = int(config.hidden_size)
    proj_weight = read_tensor(ckpt, layout.projection)
    _check_shape(ckpt, layout.projection, proj_weight, (hidden, 2 * hidden))
    projection = _loaded_linear(proj_weight, device, dtype)
    embed, head = _embed_and_head(model, ckpt, layout, dtype, device)
    rotary, window, layer_type = _rotary(model.get_decoder(), config)
    module = MtpHead(
        enorm=_norm(model, config, ckpt, layout.enorm, dtype, device),
        hnorm=_norm(model, config, ckpt, layout.hnorm, dtype, device),
        projection=projection,
        block=block,
        final_norm=_norm(model, config, ckpt, layout.final_norm, dtype, device),
        embed=embed,
        head=head,
        rotary=rotary,
        hidden_first=layout.hidden_first,
        window=window,
        layer_type=layer_type,
    )
    _refuse_unloaded(model, module)
    return module.eval()


def _param_dtype(
    key: str, value: torch.Tensor, dtype: torch.dtype, keep32: tuple[str, ...]
) -> torch.dtype:
    """Compute dtype, except what the model class keeps in float32 (e.g. router weights)."""
    if not value.is_floating_point():
        return value.dtype
    return torch.float32 if any(k in key for k in keep32) else dtype


def _keep_in_fp32(model: Any) -> tuple[str, ...]:
    names: list[str] = []
    for attr in ("_keep_in_fp32_modules", "_keep_in_fp32_modules_strict"):
        names.extend(getattr(model, attr, None) or ())
    return tuple(names)


def hidden_and_logits(model: Any, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One main-model forward: (last hidden state after the final norm, logits)."""
    out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    return out.hidden_states[-1], out.logits
