"""``accept --online``: a real draft-then-verify speculative decoding loop.

The MTP layers draft k tokens (k = 1 for one MTP layer; a chain of D layers drafts D), the main
model verifies them in one pass, exactly as a serving engine's MTP speculative decoding does;
what the loop accepts online is reported beside the teacher-forced figure at the very
positions it drafted (tests: the two agree pass by pass, greedy).

Each step, for every sequence with tokens ``x_0..x_m``:

1. depth 1 over slots ``0..m-1`` (slot t: ``h_t`` and ``x_{t+1}``; the hidden states come
   from the previous verify pass, where they belonged to verified tokens) -> draft ``d_1`` for
   position ``m+1`` from slot ``m-1`` (greedy: argmax q; sampling: d ~ q); depth j > 1 over
   the same slots takes depth j-1's states and the tokens shifted by j, ending in
   ``d_1..d_{j-1}``, and drafts ``d_j`` from slot ``m-1``;
2. main model over ``x_0..x_m, d_1..d_k`` -> p at ``m..m+k``;
3. drafts are checked in order: greedy, ``d_j`` is accepted iff it is argmax of p at
   ``m+j-1``; sampling, with ``min(1, p(d_j) / q_j(d_j))``, and on the first rejection the
   token is drawn from ``norm(max(p - q_j, 0))``. The first rejected draft is replaced by the
   main model's token; when all k are accepted the bonus token from p at ``m+k`` follows.

Sequences run as one right-padded batch: attention is causal and MoE routing is per token, so
padding after a sequence cannot change its positions. The main model and MTP layers are
recomputed over the whole prefix every step (no KV caches), which is slow but has nothing to
get wrong: every depth sees its own states at every earlier slot, as in training.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpcheck.accept.decoded import Decoded, Draft
from mtpcheck.accept.head import hidden_and_logits
from mtpcheck.accept.loading import Drafter
from mtpcheck.accept.metrics import distributions
from mtpcheck.accept.options import AcceptOptions
from mtpcheck.accept.sampling import TokenSampler
from mtpcheck.accept.scoring import score_depths
from mtpcheck.accept.workloads import Workload
from mtpcheck.errors import MtpcheckError
from mtpcheck.model import OnlineAcceptance
from mtpcheck.torch_threads import configure_torch_threads


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
    """Generate ``new_tokens`` or more tokens after each prompt, k drafts a verify pass
    (k = the drafter's chained MTP depths)."""
    sampler = TokenSampler.seeded(temperature, seed)
    seqs = [list(p) for p in prompts]
    targets = [len(p) + new_tokens for p in prompts]
    k = drafter.chain.depths
    out = Decoded(seqs, k=k)

    # prefill: the first new token comes from the main model alone
    dev = drafter.device
    hidden, logits = hidden_and_logits(drafter.model, _padded(seqs, pad).to(dev))
    states = []  # per sequence: main hidden states h_0..h_{m-1}, all of verified tokens
    for b, s in enumerate(seqs):
        states.append(hidden[b, : len(s)])
        s.append(sampler.pick(logits[b, len(s) - 1]))

    while True:
        active = [b for b, s in enumerate(seqs) if len(s) < targets[b]]
        if not active:
            return out
        rows = [seqs[b] for b in active]
        state = torch.zeros(
            len(rows),
            max(len(s) for s in rows) - 1,  # slots 0..m-1 of the longest row
            hidden.shape[-1],
            dtype=hidden.dtype,
            device=dev,
        )
        for i, b in enumerate(active):
            state[i, : len(states[b])] = states[b].to(dev)
        extended, q_last = _draft_rows(drafter, rows, state, sampler, pad)
        hidden, logits = hidden_and_logits(drafter.model, _padded(extended, pad).to(dev))
        for i, (b, s) in enumerate(zip(active, rows, strict=True)):
            m = len(s) - 1
            drafts = extended[i][m + 1 :]
            taken, next_token, alphas = _verify_row(logits[i], m, drafts, q_last[i], k, sampler)
            out.drafts.append(Draft(b, m - 1, taken, tuple(alphas)))
            s.extend([*drafts[:taken], next_token])
            states[b] = hidden[i, : m + taken + 1]  # h_0..h_{m+taken}: verified tokens


def _draft_rows(
    drafter: Drafter,
    rows: list[list[int]],
    state: torch.Tensor,
    sampler: TokenSampler,
    pad: int,
) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """Depths 1..k over every slot of each row (``state``: the rows' main hidden states):
    each row extended by its k drafts, and per row the logits each depth drafted from."""
    dev = drafter.device
    extended = [list(s) for s in rows]  # x_0..x_m, then the drafts so far
    q_last: list[list[torch.Tensor]] = [[] for _ in rows]
    for j in range(1, drafter.chain.depths + 1):
        tokens = _padded([e[j : j + len(s) - 1] for e, s in zip(extended, rows, strict=True)], pad)
        q, state = drafter.chain.step(j, state, tokens.to(dev))
        for i, s in enumerate(rows):
            q_last[i].append(q[i, len(s) - 2])  # slot m-1
            extended[i].append(sampler.pick(q_last[i][-1]))
    return extended, q_last


def _verify_row(
    logits: torch.Tensor,
    m: int,
    drafts: list[int],
    q_row: list[torch.Tensor],
    k: int,
    sampler: TokenSampler,
) -> tuple[int, int, list[float]]:
    """Check one row's drafts against the main model's ``logits`` (the row's, ``m``: its last
    verified position): (drafts accepted, the next token, alpha or greedy hit per depth up to
    the first rejected)."""
    temperature = sampler.temperature
    alphas: list[float] = []
    next_token = -1
    for j, d in enumerate(drafts, start=1):
        p_logits = logits[m + j - 1]
        q = q_row[j - 1].to(p_logits.device)
        if temperature == 0:
            accepted = int(p_logits.argmax()) == d
            alphas.append(float(accepted))
            correction = int(p_logits.argmax())
        else:
            p = distributions(p_logits, temperature)
            qp = distributions(q, temperature)
            alphas.append(float(torch.minimum(p, qp).sum()))
            ratio = min(1.0, float(p[d] / qp[d]))
            accepted = sampler.uniform() < ratio
            residual = (p - qp).clamp(min=0)
            correction = sampler.draw(residual / residual.sum()) if not accepted else -1
        if not accepted:
            next_token = correction
            break
    taken = len(alphas) - (next_token >= 0)
    if next_token < 0:  # all k accepted: the bonus token
        next_token = sampler.pick(logits[m + k])
    return taken, next_token, alphas


def teacher_forced_at(
    drafter: Drafter,
    sequences: list[list[int]],
    passes: list[tuple[int, int, int]],
    k: int,
    temperature: float,
    argmax_drafts: bool = False,
) -> tuple[tuple[float, ...], list[int]]:
    """The teacher-forced verdicts at the positions a decoding run drafted, scored on what it
    generated: per depth d, the share of ``passes`` (sequence, slot, accepted) whose drafts
    1..d all hit (greedy) or the mean product of alpha over depths 1..d (T > 0); and per pass
    the number of leading teacher-forced hits. ``argmax_drafts``: alpha is ``p(argmax q)``, the
    acceptance of drafts taken as q's argmax (vLLM's default), not ``sum min(p, q)``."""
    scored = score_depths(drafter, sequences, temperature, argmax_drafts)
    greedy = temperature == 0
    leading: list[int] = []
    shares = [[0.0, 0] for _ in range(k)]  # per depth: sum of the teacher-forced figure, passes
    for sequence, slot, _ in passes:
        run, product = 0, 1.0
        for j in range(min(k, len(scored[sequence]))):  # the depths the layers chain
            hits, alphas = scored[sequence][j]
            if slot >= len(hits):  # past the generated text: nothing left to score
                break
            product *= float(alphas[slot])
            run += int(run == j and bool(hits[slot]))
            shares[j][0] += float(run > j) if greedy else product
            shares[j][1] += 1
        leading.append(run)
    return tuple(total / n if n else 0.0 for total, n in shares), leading


@dataclass(frozen=True)
class _Run:
    """What one online decoding run left to score."""

    sequences: list[list[int]]
    k: int
    passes: list[tuple[int, int, int]]
    """(sequence, slot, drafts counted as accepted) per verify pass."""
    in_output: int | None = None
    """transformers only: depth-1 drafts that stand in the output."""


def _online_prompts(workload: Workload, prompt_tokens: int) -> list[list[int]]:
    """Each sequence's first ``prompt_tokens`` tokens (those with two at least)."""
    prompts = [list(s[:prompt_tokens]) for s in workload.sequences]
    prompts = [p for p in prompts if len(p) >= 2]
    if not prompts:
        raise MtpcheckError(
            f"workload {workload.name}: no sequence has the {prompt_tokens} prompt "
            "tokens --online starts from"
        )
    return prompts


def _decode(drafter: Drafter, prompts: list[list[int]], options: AcceptOptions) -> _Run:
    """Draft-then-verify decoding by the engine and rule ``options`` name."""
    temperature = options.temperature
    if options.online_engine == "transformers":
        from mtpcheck.accept.online_transformers import transformers_decode

        generated = transformers_decode(
            drafter.model, drafter.prefixes, prompts, options.new_tokens, temperature,
            seed=options.seed,
        )  # fmt: skip
        sequences = generated.sequences
        in_output = sum(
            sequences[s.sequence][s.position] == s.drafts[0]
            for s in generated.steps
            if s.position < len(sequences[s.sequence])
        )
        passes = [(s.sequence, s.position - 2, max(0, s.counted)) for s in generated.steps]
        return _Run(sequences, generated.k, passes, in_output)
    if options.draft_rule == "engine":
        from mtpcheck.accept.engine_rule import engine_decode
        from mtpcheck.families import FAMILY_BY_NAME

        family = FAMILY_BY_NAME[drafter.family]
        k = options.depths or drafter.chain.depths
        decoded = engine_decode(
            drafter,
            prompts,
            options.new_tokens,
            k,
            family.serving.first_state,
            family.serving.zeroes_position0,
            bool(family.layout.copies),
            temperature,
            seed=options.seed,
        )
    else:
        decoded = speculative_decode(
            drafter, prompts, options.new_tokens, temperature, seed=options.seed
        )
        k = decoded.k
    passes = [(d.sequence, d.slot, d.depth_accepted) for d in decoded.drafts]
    return _Run(decoded.sequences, k, passes)


def measure_online(
    drafter: Drafter, workload: Workload, options: AcceptOptions, label: str
) -> OnlineAcceptance:
    """Draft-then-verify decoding from each sequence's first ``prompt_tokens`` tokens, and the
    teacher-forced verdicts at the positions it drafted (scored on what it generated).

    ``online_engine``: ``mtpcheck``, this package's loop (``accept/online.py``), or
    ``transformers``, ``generate(use_mtp=True)`` with what transformers counts."""
    prompts = _online_prompts(workload, options.prompt_tokens)
    configure_torch_threads()  # decoding runs thousands of small ops: see mtpcheck.torch_threads
    run = _decode(drafter, prompts, options)
    temperature, passes, k = options.temperature, run.passes, run.k
    argmax_drafts = options.online_engine == "mtpcheck" and options.draft_rule == "engine"
    by_depth, leading = teacher_forced_at(
        drafter, run.sequences, passes, k, temperature, argmax_drafts
    )
    greedy = temperature == 0
    count = len(passes)
    accepted = sum(taken >= 1 for _, _, taken in passes)
    drafted = sum(taken for _, _, taken in passes)
    per_depth = tuple(sum(taken > j for _, _, taken in passes) for j in range(k))
    return OnlineAcceptance(
        checkpoint=label,
        workload=workload.name,
        temperature=temperature,
        sequences=len(prompts),
        prompt_tokens=options.prompt_tokens,
        new_tokens=options.new_tokens,
        drafts=count,
        accepted=accepted,
        online=accepted / count if count else 0.0,
        tokens_per_pass=1 + (drafted / count if count else 0.0),
        teacher_forced=by_depth[0],
        agreeing=(
            sum(t == taken for t, (_, _, taken) in zip(leading, passes, strict=True))
            if greedy
            else None
        ),
        k=k,
        accepted_per_depth=per_depth if k > 1 else (),
        teacher_forced_per_depth=by_depth if k > 1 else (),
        engine=options.online_engine,
        accepted_tokens=drafted,
        in_output=run.in_output if greedy else None,
        draft_rule=options.draft_rule,
    )
