"""Teacher-forced scoring: one batched forward pass per group of sequences, every depth's
draft scored against the main model's distribution at every position."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mtpcheck.accept.head import (
    hidden_and_logits,
)
from mtpcheck.accept.loading import Drafter
from mtpcheck.accept.metrics import (
    ChainCounts,
    SequenceCounts,
    alpha_per_position,
    argmax_acceptance,
    chain_counts,
    greedy_hits,
)
from mtpcheck.accept.workloads import Workload
from mtpcheck.ticker import Ticker

LOGIT_BUDGET = 1 << 27
"""Most logits (batch x length x vocab) one batched forward pass may produce."""

MAX_BATCH = 64


@torch.no_grad()
def score_depths(
    drafter: Drafter,
    batch: Sequence[Sequence[int]],
    temperature: float,
    argmax_drafts: bool = False,
) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per sequence, per depth j = 1..D, per slot t in 0..L-1-j: (greedy hit, alpha) of depth
    j's draft for token t+j+1, scored against the main model's distribution at t+j. alpha is
    ``sum min(p, q)`` (drafts sampled from q), or with ``argmax_drafts`` ``p(argmax q)`` (drafts
    taken as q's argmax and rejection-sampled, as vLLM does by default).

    Sequences are right-padded into one forward pass: attention is causal and MoE routing is
    per token, so padding after a sequence never reaches its positions.
    """
    width = max(len(ids) for ids in batch)
    rows = [list(ids) + [0] * (width - len(ids)) for ids in batch]
    x = torch.tensor(rows, dtype=torch.long, device=drafter.device)
    hidden, logits = hidden_and_logits(drafter.model, x)
    per_depth = drafter.chain(hidden, x)
    scores = []
    for i, ids in enumerate(batch):
        row = []
        for j, q_logits in enumerate(per_depth, start=1):
            n = max(0, len(ids) - j)
            p, q = logits[i, j : j + n], q_logits[i, :n].to(logits.device)
            alpha = (
                argmax_acceptance(p, q, temperature)
                if argmax_drafts
                else alpha_per_position(p, q, temperature)
            )
            row.append((greedy_hits(p, q).cpu(), alpha.cpu()))
        scores.append(row)
    return scores


def score_batch(
    drafter: Drafter, batch: Sequence[Sequence[int]], temperature: float
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence, per position t in 0..L-2: (greedy hit, alpha) of the draft for token t+2
    (depth 1)."""
    return [row[0] for row in score_depths(drafter, batch, temperature)]


def score_sequence(
    drafter: Drafter, ids: Sequence[int], temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position t in 0..L-2: (greedy hit, alpha) of the draft for token t+2."""
    return score_batch(drafter, [ids], temperature)[0]


def batches(sequences: Sequence[Sequence[int]], vocab: int) -> list[list[int]]:
    """Indices of the sequences (2+ tokens) grouped so each batch stays in the logit budget."""
    groups: list[list[int]] = []
    current: list[int] = []
    width = 0
    for index, ids in enumerate(sequences):
        if len(ids) < 2:
            continue
        wider = max(width, len(ids))
        if current and (
            len(current) >= MAX_BATCH or (len(current) + 1) * wider * vocab > LOGIT_BUDGET
        ):
            groups.append(current)
            current, wider = [], len(ids)
        current.append(index)
        width = wider
    if current:
        groups.append(current)
    return groups


def measure(
    drafter: Drafter | None,
    workload: Workload,
    temperature: float,
    ticker: Ticker | None = None,
) -> tuple[list[SequenceCounts], list[ChainCounts]]:
    """Counters per sequence (depth 1), and for a chain of D > 1 layers the chain's; all
    zeros without a drafter. ``ticker`` counts the positions scored."""
    counts = [SequenceCounts(max(0, len(ids) - 1), 0, 0.0) for ids in workload.sequences]
    if drafter is None:
        return counts, []
    depths = drafter.chain.depths
    chained = [ChainCounts(0, (0,) * depths, (0.0,) * depths)] * len(counts)
    vocab = int(drafter.model.get_output_embeddings().weight.shape[0])
    for group in batches(workload.sequences, vocab):
        scores = score_depths(drafter, [workload.sequences[i] for i in group], temperature)
        for index, row in zip(group, scores, strict=True):
            hits, alpha = row[0]
            counts[index] = SequenceCounts(
                counts[index].positions, int(hits.sum()), float(alpha.sum())
            )
            if depths > 1:
                slots = max(0, len(workload.sequences[index]) - depths)
                chained[index] = chain_counts(slots, [h for h, _ in row], [a for _, a in row])
        if ticker is not None:
            ticker.advance(sum(counts[i].positions for i in group), f"sequence {group[-1] + 1}")
    if ticker is not None:
        ticker.finish(f"{len(counts)} sequences")
    return counts, chained if depths > 1 else []
