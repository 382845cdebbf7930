"""Acceptance figures of ``mtpcheck accept``: offline (teacher-forced), online (draft then
verify) and a serving engine's, with their differences between two checkpoints."""

from __future__ import annotations

from dataclasses import dataclass

from mtpcheck.model.modes import DraftRule, OnlineEngine


@dataclass(frozen=True)
class Estimate:
    """A measured share and its 95 % interval over sequences (``low`` and ``high`` are None
    when it cannot be estimated: fewer than two sequences, or no positions)."""

    value: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class AcceptanceResult:
    """Offline MTP acceptance of one checkpoint on one workload (``mtpcheck accept``).

    Teacher-forced, one draft token (k = 1): at each position t the MTP head's distribution q
    for token t+2 (from hidden state t and the embedding of token t+1) is scored against the
    main model's distribution p at t+1. Rates pool positions over sequences (ratio of sums);
    confidence intervals are 95 % over sequences (None with fewer than two sequences).
    """

    checkpoint: str
    workload: str
    drafter: bool
    """False when the checkpoint has no usable MTP layer ("no drafter": acceptance 0)."""
    note: str
    """Why there is no drafter; empty otherwise."""
    sequences: int
    positions: int
    greedy_hits: int
    greedy: Estimate
    """Fraction of positions where argmax q == argmax p."""
    alpha: Estimate
    """Mean over positions of sum_v min(p(v), q(v)) at ``temperature``."""
    tokens_per_pass: float
    """Expected tokens per target forward pass, 1 + alpha."""
    temperature: float
    chain: ChainAcceptance | None = None
    """Several MTP layers drafting in a chain (k = D): acceptance per depth."""


@dataclass(frozen=True)
class DepthAcceptance:
    """Depth d of a chain: the share of slots where drafts 1..d are all accepted."""

    depth: int
    greedy: Estimate
    alpha: Estimate
    """Mean over slots of the product of alpha at depths 1..d."""
    tokens_per_pass: float
    """Expected tokens per verify pass when drafting d tokens: 1 + alpha of depths 1..d."""


@dataclass(frozen=True)
class ChainAcceptance:
    """Teacher-forced acceptance of D chained MTP layers (k = D drafts per verify pass).

    At slot t depth j drafts token t+j+1 from depth j-1's state and token t+j; it is scored
    against the main model's distribution at t+j. Only slots where all D depths can be scored
    count (``positions``), so every depth is over the same slots.
    """

    hidden: str
    """What depth d passes to depth d+1: ``post-norm`` or ``pre-norm``."""
    positions: int
    depths: tuple[DepthAcceptance, ...]
    tokens_per_pass: Estimate
    """Expected tokens per verify pass with k = D: 1 + sum over depths of alpha."""
    greedy_tokens_per_pass: float
    """The same from greedy verdicts: 1 + the mean number of leading accepted drafts."""


@dataclass(frozen=True)
class OnlineAcceptance:
    """What a real draft-then-verify decoding run accepted (``accept --online``), and the
    teacher-forced figure at the very positions it drafted.

    Each sequence's first ``prompt_tokens`` tokens are the prompt; ``new_tokens`` or more are
    generated, k drafts (1, or the D chained MTP layers) verified per main-model pass.
    """

    checkpoint: str
    workload: str
    temperature: float
    sequences: int
    prompt_tokens: int
    new_tokens: int
    drafts: int
    """Verify passes (each with k drafts)."""
    accepted: int
    """Passes whose depth-1 draft was accepted (position 1 of ``accepted_per_position`` in
    the JSON report)."""
    online: float
    """accepted / drafts: the depth-1 acceptance."""
    tokens_per_pass: float
    """Tokens emitted per verify pass: 1 + accepted drafts of all depths / passes."""
    teacher_forced: float
    """At the drafted positions: the greedy hit rate (T = 0) or mean alpha (T > 0), depth 1."""
    agreeing: int | None
    """T = 0: verify passes whose online verdict (the number of drafts accepted) equals the
    teacher-forced one (None when T > 0, where online verdicts are random draws)."""
    k: int = 1
    """Drafts per verify pass (the chained MTP depths)."""
    accepted_per_depth: tuple[int, ...] = ()
    """k > 1: passes whose drafts 1..d were all accepted, for d = 1..k."""
    teacher_forced_per_depth: tuple[float, ...] = ()
    """k > 1: the teacher-forced share for the same, at the drafted positions."""
    engine: OnlineEngine = OnlineEngine.MTPCHECK
    """Whose decoding loop ran: ``mtpcheck`` or ``transformers`` (``generate(use_mtp=True)``,
    its counts as transformers reports them)."""
    accepted_tokens: int = 0
    """Drafts accepted at every depth, summed over passes (the engines' ``accepted_tokens``)."""
    in_output: int | None = None
    """transformers, T = 0: first drafts the generated text holds at their position (each one
    the main model's greedy token, so accepted in fact; transformers' count can be lower)."""
    draft_rule: DraftRule = DraftRule.ENGINE
    """How the drafts were made: ``engine`` (vLLM's rule: deeper depths see only the slots
    they drafted at, layers reused, argmax drafts) or ``training`` (every depth over every
    slot, drafts sampled from q)."""

    @property
    def online_by_depth(self) -> tuple[float, ...]:
        """Per depth d: the share of passes whose drafts 1..d were accepted (k entries)."""
        if not self.accepted_per_depth:
            return (self.online,)
        return tuple(a / self.drafts if self.drafts else 0.0 for a in self.accepted_per_depth)

    @property
    def teacher_forced_by_depth(self) -> tuple[float, ...]:
        """The teacher-forced share of the same (k entries)."""
        return self.teacher_forced_per_depth or (self.teacher_forced,)

    @property
    def engine_title(self) -> str:
        """Whose loop ran, in words."""
        if self.engine == OnlineEngine.TRANSFORMERS:
            return "transformers generate(use_mtp=True)"
        if self.draft_rule == DraftRule.ENGINE:
            return "draft-then-verify, vLLM's draft rule"
        return "draft-then-verify, training rule"


@dataclass(frozen=True)
class EngineAcceptance:
    """What a serving engine's own MTP speculative decoding accepted (``accept --engine``),
    read from the engine's counters, on one workload.

    Per position i (1..k): the share of verify steps whose first i drafts were all accepted
    (vLLM's ``num_accepted_tokens_per_pos[i-1] / num_drafts``). Intervals are over requests.
    """

    checkpoint: str
    workload: str
    engine: str
    """The engine and its version, e.g. ``vLLM 0.32.0``."""
    k: int
    temperature: float
    requests: int
    prompt_tokens: int
    new_tokens: int
    generated_tokens: int
    drafts: int
    """Verify steps that carried drafts (vLLM: ``spec_decode_num_drafts``)."""
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]
    by_position: tuple[Estimate, ...]
    """Per position: steps whose first i drafts were accepted / steps, with its interval."""
    mean_acceptance_length: Estimate
    """1 + accepted tokens / steps: tokens emitted per target pass."""
    parallel: str = ""
    """How the engine was spread, e.g. ``tp=8 pp=2``."""
    teacher_forced: tuple[float, ...] = ()
    """``--teacher-forced``: per position, mtpcheck's teacher-forced share at the positions the
    engine drafted, on the engine's own output (empty when not asked)."""
    agreeing: int | None = None
    """Greedy with ``--teacher-forced``: steps whose accepted count equals the teacher-forced
    one."""

    @property
    def acceptance(self) -> float:
        """Accepted draft tokens / draft tokens (vLLM's headline acceptance rate)."""
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    drafter: str = ""
    """The separate drafter vLLM drafted with (``--drafter``), in words; empty: the
    checkpoint's own MTP layers."""


@dataclass(frozen=True)
class EngineDelta:
    """Engine acceptance of the compared checkpoint minus the reference's, one workload;
    paired over the same prompts, intervals over requests."""

    workload: str
    first_position: Estimate
    mean_acceptance_length: Estimate


@dataclass(frozen=True)
class AcceptanceDelta:
    """Acceptance of the compared checkpoint minus the reference's, on one workload.

    Paired over the same tokenised sequences; the 95 % intervals are over sequences.
    """

    workload: str
    greedy: Estimate
    alpha: Estimate
    tokens_per_pass: float


@dataclass(frozen=True)
class Share:
    """A share measured over requests, with the standard error a later run is tested against
    (``accept --profile``), beside its 95 % interval."""

    estimate: Estimate
    error: float | None
    """The linearised standard error over requests (None with fewer than two requests)."""


@dataclass(frozen=True)
class ServerAcceptance:
    """What a running server's own speculative decoding accepted on one workload
    (``accept --server``), from the engine's per-request figures or the difference of its
    Prometheus counters over exactly mtpcheck's requests.

    Position i (1..k): the share of verify steps whose first i drafts were all accepted.
    Engines that count only draft tokens (llama.cpp) give no positions: ``acceptance`` alone.
    """

    workload: str
    engine: str
    """The engine and its version, e.g. ``vLLM 0.32.0``."""
    server: str
    model: str
    source: str
    """``per-request`` (the engine's figures in each response) or ``counters`` (its
    Prometheus counters before and after each request)."""
    temperature: float
    requests: int
    prompt_tokens: int | None
    """Token ids per prompt; None where prompts went as text (no tokenizer given)."""
    new_tokens: int
    generated_tokens: int
    k: int | None
    """Drafts per verify step, where the figures tell it."""
    drafts: int | None
    """Verify steps that carried drafts (None where the engine does not count them)."""
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]
    by_position: tuple[Share, ...]
    acceptance: Share
    """Accepted draft tokens / draft tokens."""
    mean_acceptance_length: Estimate | None
    """1 + accepted tokens / verify steps: tokens per target pass (None without steps)."""
    expected: tuple[Share, ...] = ()
    """With CKPT: per position, what the checkpoint's drafter accepts offline on the same
    prompts by the engine's draft rule (``--online``'s rule); empty otherwise."""
    drafter: str = ""
    """The separate drafter the user says the server drafts with (``--drafter``), in words;
    empty: the model's own MTP layers."""
