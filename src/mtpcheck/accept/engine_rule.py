"""vLLM's draft rule, run offline (``accept --online --draft-rule engine``).

vLLM's MTP proposer (``vllm/v1/spec_decode``, ``deepseek_mtp.py``, ``step3p5_mtp.py``,
vLLM 0.32) drafts k tokens a verify pass differently from training:

* depth 1 runs over the newly verified positions (pair ``(h_t, x_{t+1})`` at position t),
  writing the MTP layer's KV cache there, and drafts from the last one;
* depth d >= 2 runs one token a request a step, at position ``m + d - 2``, on MTP layer
  ``(d - 1) % n`` (a one-layer checkpoint reuses its layer), fed the state depth d - 1
  left; each layer's KV cache therefore holds, besides depth 1's entries in layer 0, only the
  positions it drafted at, rejected drafts included;
* the state fed back is the layer's output after its final norm (DeepSeek) or before it
  (Step), as :class:`~mtpcheck.families.interface.ChainHidden` says; depth 1 is fed the main
  model's last state after ``model.norm`` (DeepSeek) or before it (Step: ``engine_first_state``);
* DeepSeek's loader zeroes the MTP embedding at position 0;
* the KV cache slots of a layer's own positions that it never wrote (depth d >= 2 of a
  checkpoint with several layers writes one position a step) are still attended to: on a fresh
  engine they hold zeros (the cache is allocated with ``torch.zeros``), so each contributes a
  zero key and value. A zero block input gives exactly that where the attention projections
  have no bias, which is how it is modelled here (vLLM's Step-3.7 counters are reproduced
  only so); a long-running server holds other requests' stale entries there instead;
* the proposer shares the target's embedding and output head with every MTP layer whose
  checkpoint stores copies of them (``llm_base_proposer.py``, ``_maybe_share_embeddings`` /
  ``_maybe_share_lm_head``): a checkpoint whose stored copies differ from the main tensors is
  served with the main ones. A layer with a head of its own (Step) keeps it.

A KV cache entry depends only on the layer's input at its position, so each layer keeps its
inputs by position and recomputes attention over them: the same numbers, with nothing cached
to get wrong.

Sampling (T > 0) follows vLLM 0.32's defaults (``draft_sample_method: greedy``, the standard
rejection sampler without draft probabilities, ``v1/sample/rejection_sampler.py``): drafts are
still the MTP layer's argmax; draft ``d`` is accepted with probability ``p_T(d)``, and on the
first rejection the token is drawn from ``p_T`` with ``d`` removed, renormalised; when all k
are accepted the bonus token is drawn from ``p_T``. The expected acceptance of a draft is
therefore ``p_T(argmax q)``, not the ``sum min(p, q)`` of drafts sampled from q.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpcheck.accept.decoded import Decoded, Draft
from mtpcheck.accept.head import MtpHead
from mtpcheck.accept.loading import Drafter
from mtpcheck.accept.metrics import distributions
from mtpcheck.accept.sampling import TokenSampler
from mtpcheck.errors import MtpcheckError
from mtpcheck.families import ChainHidden


def _mask(positions: torch.Tensor, dtype: torch.dtype, window: int | None) -> torch.Tensor:
    """Additive mask over entries at ``positions`` (ascending): each sees those at or before
    it, within a sliding ``window`` of positions where the layer has one."""
    gap = positions[:, None] - positions[None, :]
    allowed = gap >= 0
    if window is not None:
        allowed &= gap < window
    mask = torch.zeros(gap.shape, dtype=dtype, device=positions.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def _block(head: MtpHead, entries: dict[int, torch.Tensor], upto: int) -> torch.Tensor:
    """The block's output at position ``upto`` given the layer's inputs by position; a
    position up to it that the layer never wrote is a zeroed cache slot (zero input)."""
    zero = torch.zeros_like(next(iter(entries.values())))
    positions = list(range(upto + 1))
    x = torch.stack([entries.get(p, zero) for p in positions])[None]
    pos = torch.tensor(positions, device=x.device)
    return head.run_block(x, pos[None], _mask(pos, x.dtype, head.window))[0, -1]


def _main(drafter: Drafter, ids: list[int], pre_norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """One main-model pass: (the state depth 1 is fed at every position, logits)."""
    model = drafter.model
    captured: list[torch.Tensor] = []
    hook = None
    if pre_norm:
        hook = model.get_decoder().norm.register_forward_hook(
            lambda _m, args, _o: captured.append(args[0])
        )
    try:
        x = torch.tensor([ids], dtype=torch.long, device=drafter.device)
        out = model(input_ids=x, output_hidden_states=True, use_cache=False)
    finally:
        if hook is not None:
            hook.remove()
    state = captured[-1] if pre_norm else out.hidden_states[-1]
    return state[0], out.logits[0]


def _verify(
    sampler: TokenSampler, logits: torch.Tensor, drafts: list[int]
) -> tuple[int, int, list[float]]:
    """vLLM 0.32's rejection sampler without draft probabilities: (drafts accepted, the next
    token, per depth up to the first rejected: the greedy hit or p_T(draft))."""
    temperature = sampler.temperature
    scores: list[float] = []
    for j, d in enumerate(drafts):
        if temperature == 0:
            best = int(logits[j].argmax())
            scores.append(float(best == d))
            if best != d:
                return j, best, scores
            continue
        p = distributions(logits[j], temperature)
        scores.append(float(p[d]))
        if sampler.uniform() >= float(p[d]):
            residual = p.clone()
            residual[d] = 0
            return j, sampler.draw(residual / residual.sum()), scores
    return len(drafts), sampler.pick(logits[len(drafts)]), scores


@dataclass(frozen=True)
class _Layers:
    """The MTP layers as vLLM's proposer runs them: ``heads`` depth 1's first (depth d runs
    layer ``(d - 1) % len(heads)``); depth 1 is fed the main model's last state after its
    final norm or before it (``first_state``); the MTP embedding is zeroed at position 0 where
    ``zero_first`` (DeepSeek's loader); the main model's embedding and head stand for the
    stored copies where ``main_copies``."""

    drafter: Drafter
    heads: tuple[MtpHead, ...]
    first_state: ChainHidden
    zero_first: bool
    main_copies: bool

    def embed(self, head: MtpHead) -> torch.nn.Module:
        """The embedding ``head`` drafts through."""
        if self.main_copies:
            main: torch.nn.Module = self.drafter.model.get_input_embeddings()
            return main
        return head.embed

    def output(self, head: MtpHead) -> torch.nn.Module:
        """The output head ``head`` drafts through."""
        if self.main_copies:
            main: torch.nn.Module = self.drafter.model.get_output_embeddings()
            return main
        return head.head

    def main(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One main-model pass: (the state depth 1 is fed at every position, logits)."""
        return _main(self.drafter, ids, self.first_state is ChainHidden.PRE_NORM)


def _refuse_attention_bias(heads: tuple[MtpHead, ...]) -> None:
    """Depths 2+ model the zeroed cache slots as zero inputs, exact only without biases."""
    for head in heads[1:]:
        biased = [n for n, _ in head.block.named_parameters() if "attn" in n and "bias" in n]
        if biased:
            raise MtpcheckError(
                f"--draft-rule engine: the MTP block's attention has biases ({biased[0]}), "
                "so the zeroed cache slots of depths 2+ cannot be modelled as zero inputs"
            )


def _draft(
    layers: _Layers,
    caches: list[dict[int, torch.Tensor]],
    seq: list[int],
    state: torch.Tensor,
    k: int,
) -> list[int]:
    """The ``k`` drafts after ``seq`` (``state``: the main model's at its verified tokens),
    each layer's inputs kept by position in ``caches``."""
    heads, device = layers.heads, layers.drafter.device
    m = len(seq) - 1
    # depth 1: every verified pair (h_t, x_{t+1}), t = 0..m-1, into layer 0's cache
    positions = torch.arange(m)
    tokens = torch.tensor(seq[1 : m + 1], device=device)
    zeroed = positions == 0 if layers.zero_first else None
    x = heads[0].project(state[:m], tokens, layers.embed(heads[0]), zeroed)
    caches[0].update({t: x[t] for t in range(m)})
    drafts: list[int] = []
    feed: torch.Tensor | None = None
    for depth in range(1, k + 1):
        layer = (depth - 1) % len(heads)
        head = heads[layer]
        at = m - 2 + depth
        if depth > 1:
            assert feed is not None  # depth - 1 left it
            token = torch.tensor([drafts[-1]], device=device)
            zeroed = torch.tensor([at == 0]) if layers.zero_first else None
            x = head.project(feed[None], token, layers.embed(head), zeroed)
            caches[layer][at] = x[0]
        block = _block(head, caches[layer], at)
        normed = head.final_norm(block)
        feed = normed if layers.drafter.chain.chain_hidden is ChainHidden.POST_NORM else block
        drafts.append(int(layers.output(head)(normed).argmax()))
    return drafts


def _decode_sequence(
    layers: _Layers,
    sampler: TokenSampler,
    index: int,
    seq: list[int],
    new_tokens: int,
    k: int,
    out: Decoded,
) -> None:
    """Extend ``seq`` (sequence ``index``) by ``new_tokens`` or more, one verify pass at a
    time; each pass's drafts go to ``out``."""
    target = len(seq) + new_tokens
    caches: list[dict[int, torch.Tensor]] = [{} for _ in layers.heads]
    state, logits = layers.main(seq)
    seq.append(sampler.pick(logits[-1]))
    while len(seq) < target:
        m = len(seq) - 1
        drafts = _draft(layers, caches, seq, state, k)
        state, logits = layers.main(seq + drafts)
        taken, following, scores = _verify(sampler, logits[m:], drafts)
        out.drafts.append(Draft(index, m - 1, taken, tuple(scores)))
        seq.extend([*drafts[:taken], following])
        state = state[: m + taken + 1]


@torch.no_grad()
def engine_decode(
    drafter: Drafter,
    prompts: list[list[int]],
    new_tokens: int,
    k: int,
    first_state: ChainHidden,
    zero_first: bool,
    main_copies: bool,
    temperature: float = 0.0,
    seed: int = 0,
) -> Decoded:
    """Draft-then-verify decoding under vLLM's rule, ``k`` drafts a pass, greedy (T = 0) or
    sampled; ``main_copies``: the embedding and head the checkpoint stores copies of are the
    main model's."""
    sampler = TokenSampler.seeded(temperature, seed)
    heads = drafter.chain.layers
    _refuse_attention_bias(heads)
    layers = _Layers(drafter, heads, first_state, zero_first, main_copies)
    out = Decoded([list(p) for p in prompts], k=k)
    for index, seq in enumerate(out.sequences):
        _decode_sequence(layers, sampler, index, seq, new_tokens, k, out)
    return out
