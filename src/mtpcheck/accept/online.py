"""``accept --online``: a real draft-then-verify speculative decoding loop (k = 1).

The MTP head drafts one token, the main model verifies it, exactly as a serving engine's MTP
speculative decoding does; what the loop accepts online is reported beside the teacher-forced
figure at the very positions it drafted (tests: the two agree position by position, greedy).

Each step, for every sequence with tokens ``x_0..x_m``:

1. MTP head over slots ``0..m-1`` (slot t: ``h_t`` and ``x_{t+1}``; the hidden states come
   from the previous verify pass, where they belonged to verified tokens) -> draft ``d`` for
   position ``m+1`` from slot ``m-1`` (greedy: argmax q; sampling: d ~ q);
2. main model over ``x_0..x_m, d`` -> p at ``m`` (verifies d) and at ``m+1`` (bonus token),
   and the hidden states for the next step;
3. greedy: accept iff ``argmax p_m == d``; sampling: accept with ``min(1, p(d) / q(d))``, on
   rejection sample from ``norm(max(p - q, 0))``. An accepted draft is followed by the bonus
   token from ``p_{m+1}``.

Sequences run as one right-padded batch: attention is causal and MoE routing is per token, so
padding after a sequence cannot change its positions. The main model and head are recomputed
over the whole prefix every step (no KV caches), which is slow but has nothing to get wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mtpcheck.accept.head import hidden_and_logits
from mtpcheck.accept.metrics import distributions

if TYPE_CHECKING:
    from mtpcheck.accept.runner import Drafter


@dataclass
class Draft:
    sequence: int
    slot: int
    """Teacher-forced slot t: the draft used h_t and x_{t+1} to propose x_{t+2}."""
    accepted: bool
    alpha: float
    """sum_v min(p(v), q(v)) at the verify step (sampling) or the greedy hit (greedy)."""


@dataclass
class Decoded:
    sequences: list[list[int]]
    drafts: list[Draft] = field(default_factory=list)

    def online_rate(self) -> float:
        return sum(d.accepted for d in self.drafts) / len(self.drafts)


def _padded(rows: list[list[int]], pad: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)


@torch.no_grad()
def speculative_decode(
    drafter: Drafter,
    prompts: list[list[int]],
    new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    pad: int = 0,
) -> Decoded:
    """Generate ``new_tokens`` or more tokens after each prompt (k = 1 drafts)."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [list(p) for p in prompts]
    targets = [len(p) + new_tokens for p in prompts]
    out = Decoded(seqs)
    model, head = drafter.model, drafter.head

    def sample(probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=gen))

    def pick(logits: torch.Tensor) -> int:
        if temperature == 0:
            return int(logits.argmax())
        return sample(distributions(logits, temperature))

    # prefill: the first new token comes from the main model alone
    dev = drafter.device
    hidden, logits = hidden_and_logits(model, _padded(seqs, pad).to(dev))
    states = []  # per sequence: main hidden states h_0..h_{m-1}, all of verified tokens
    for b, s in enumerate(seqs):
        states.append(hidden[b, : len(s)])
        s.append(pick(logits[b, len(s) - 1]))

    while True:
        active = [b for b, s in enumerate(seqs) if len(s) < targets[b]]
        if not active:
            return out
        rows = [seqs[b] for b in active]
        ids = _padded(rows, pad).to(dev)
        width = ids.shape[1] - 1
        h = torch.zeros(len(rows), width, hidden.shape[-1], dtype=hidden.dtype, device=dev)
        for i, b in enumerate(active):
            h[i, : len(states[b])] = states[b]
        q_logits = head(h, ids[:, 1:])
        drafts = [pick(q_logits[i, len(s) - 2]) for i, s in enumerate(rows)]  # slot m-1
        verify = _padded([s + [d] for s, d in zip(rows, drafts, strict=True)], pad).to(dev)
        hidden, logits = hidden_and_logits(model, verify)
        for i, (b, s, d) in enumerate(zip(active, rows, drafts, strict=True)):
            m = len(s) - 1
            p_logits, q = logits[i, m], q_logits[i, m - 1]
            if temperature == 0:
                accepted = int(p_logits.argmax()) == d
                alpha = float(accepted)
                correction = int(p_logits.argmax())
            else:
                p = distributions(p_logits, temperature)
                qp = distributions(q, temperature)
                alpha = float(torch.minimum(p, qp).sum())
                ratio = min(1.0, float(p[d] / qp[d]))
                accepted = float(torch.rand((), generator=gen, dtype=torch.float64)) < ratio
                residual = (p - qp).clamp(min=0)
                correction = sample(residual / residual.sum()) if not accepted else -1
            out.drafts.append(Draft(b, m - 1, accepted, alpha))
            if accepted:  # h_0..h_{m+1} are now verified
                s.extend([d, pick(logits[i, m + 1])])
                states[b] = hidden[i, : m + 2]
            else:  # the draft at m+1 is discarded; h_0..h_m stay valid
                s.append(correction)
                states[b] = hidden[i, : m + 1]
