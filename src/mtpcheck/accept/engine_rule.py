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

import torch

from mtpcheck.accept.decoded import Decoded, Draft
from mtpcheck.accept.head import MtpHead
from mtpcheck.accept.loading import Drafter
from mtpcheck.accept.metrics import distributions
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
    gen = torch.Generator().manual_seed(seed)

    def draw(probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=gen))

    def verify(logits: torch.Tensor, drafts: list[int]) -> tuple[int, int, list[float]]:
        """(drafts accepted, the next token, per depth up to the first rejected: the greedy
        hit or p_T(draft))."""
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
            if float(torch.rand((), generator=gen, dtype=torch.float64)) >= float(p[d]):
                residual = p.clone()
                residual[d] = 0
                return j, draw(residual / residual.sum()), scores
        last = logits[len(drafts)]
        if temperature == 0:
            return len(drafts), int(last.argmax()), scores
        return len(drafts), draw(distributions(last, temperature)), scores

    heads = list(drafter.chain.heads)
    model = drafter.model
    for head in heads[1:]:
        biased = [n for n, _ in head.block.named_parameters() if "attn" in n and "bias" in n]
        if biased:
            raise MtpcheckError(
                f"--draft-rule engine: the MTP block's attention has biases ({biased[0]}), "
                "so the zeroed cache slots of depths 2+ cannot be modelled as zero inputs"
            )

    def embed(head: MtpHead) -> torch.nn.Module:
        return model.get_input_embeddings() if main_copies else head.embed

    def output(head: MtpHead) -> torch.nn.Module:
        return model.get_output_embeddings() if main_copies else head.head

    passed = drafter.chain.chain_hidden
    out = Decoded([list(p) for p in prompts], k=k)
    for index, seq in enumerate(out.sequences):
        target = len(seq) + new_tokens
        caches: list[dict[int, torch.Tensor]] = [{} for _ in heads]
        state, logits = _main(drafter, seq, first_state is ChainHidden.PRE_NORM)
        seq.append(
            int(logits[-1].argmax())
            if temperature == 0
            else draw(distributions(logits[-1], temperature))
        )
        while len(seq) < target:
            m = len(seq) - 1
            # depth 1: every verified pair (h_t, x_{t+1}), t = 0..m-1, into layer 0's cache
            positions = torch.arange(m)
            tokens = torch.tensor(seq[1 : m + 1], device=drafter.device)
            zeroed = positions == 0 if zero_first else None
            x = heads[0].project(state[:m], tokens, embed(heads[0]), zeroed)
            caches[0].update({t: x[t] for t in range(m)})
            drafts: list[int] = []
            feed = None
            for depth in range(1, k + 1):
                layer = (depth - 1) % len(heads)
                head = heads[layer]
                at = m - 2 + depth
                if depth > 1:
                    token = torch.tensor([drafts[-1]], device=drafter.device)
                    zeroed = torch.tensor([at == 0]) if zero_first else None
                    x = head.project(feed[None], token, embed(head), zeroed)
                    caches[layer][at] = x[0]
                block = _block(head, caches[layer], at)
                normed = head.final_norm(block)
                feed = normed if passed is ChainHidden.POST_NORM else block
                drafts.append(int(output(head)(normed).argmax()))
            state, logits = _main(drafter, seq + drafts, first_state is ChainHidden.PRE_NORM)
            taken, following, scores = verify(logits[m:], drafts)
            out.drafts.append(Draft(index, m - 1, taken, tuple(scores)))
            seq.extend([*drafts[:taken], following])
            state = state[: m + taken + 1]
    return out
