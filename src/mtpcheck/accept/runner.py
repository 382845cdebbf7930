"""``mtpcheck accept``: offline, teacher-forced MTP acceptance per workload.

One main-model forward pass per sequence gives, at every position, the main model's hidden
state (after its final norm) and its next-token distribution. The MTP head then drafts, for
every position t at once, token t+2 from hidden state t and the embedding of token t+1; the
draft is scored against the main model's distribution at t+1 (k = 1). With D MTP layers the
chain is scored too: depth j drafts token t+j+1 from depth j-1's state, against the main
model's distribution at t+j (k = D, :class:`~mtpcheck.accept.head.MtpChain`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mtpcheck.accept.head import (
    HeadLayout,
    MtpChain,
    MtpHead,
    build_head,
    drafter_layouts,
    hidden_and_logits,
)
from mtpcheck.accept.metrics import (
    ChainCounts,
    SequenceCounts,
    alpha_per_position,
    alpha_rate,
    chain_counts,
    chain_rates,
    chain_tokens_per_pass,
    greedy_hits,
    greedy_rate,
    paired_difference,
)
from mtpcheck.accept.workloads import Workload, load_tokenizer, tokenise
from mtpcheck.errors import InputError, MtpcheckError
from mtpcheck.families import ChainHidden, analyse, summarise
from mtpcheck.formats import open_checkpoint
from mtpcheck.formats.hf_safetensors import FORMAT as HF_FORMAT
from mtpcheck.model import (
    AcceptanceDelta,
    AcceptanceResult,
    ChainAcceptance,
    Checkpoint,
    CheckResult,
    DepthAcceptance,
    Finding,
    OnlineAcceptance,
    Report,
    Status,
)
from mtpcheck.ticker import Ticker

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class AcceptOptions:
    checkpoint: Path
    workloads: tuple[tuple[str, Path], ...]
    compare: Path | None = None
    temperature: float = 1.0
    device: str = "cpu"
    dtype: str = "auto"
    max_tokens: int = 512
    tokenizer: Path | None = None
    min_acceptance: float | None = None
    trust_pickle: bool = False
    online: bool = False
    """Also run real draft-then-verify decoding (``accept --online``)."""
    prompt_tokens: int = 9
    new_tokens: int = 40
    online_engine: str = "mtpcheck"
    """``mtpcheck`` (this package's loop) or ``transformers`` (``generate(use_mtp=True)``)."""
    depths: int | None = None
    """Chain at most this many MTP layers (k); all the checkpoint holds by default."""
    chain: str | None = None
    """Override the family's rule for what depth d passes to depth d+1 (a
    :class:`ChainHidden` value: ``post-norm`` or ``pre-norm``)."""


@dataclass(frozen=True)
class Drafter:
    """A loaded main model and its MTP layers, ready to score sequences."""

    model: Any
    chain: MtpChain
    device: torch.device
    prefixes: tuple[str, ...] = ()
    """Where the checkpoint's MTP layers live (all of them, also those not chained)."""

    @property
    def head(self) -> MtpHead:
        """Depth 1: the MTP layer every family has."""
        return self.chain.heads[0]  # type: ignore[return-value]


def model_directory(ckpt: Checkpoint) -> Path:
    """The folder transformers loads the main model (and tokenizer) from."""
    if ckpt.format != HF_FORMAT:
        raise InputError(
            ckpt.path,
            f"accept runs the main model through transformers and needs a Hugging Face "
            f"safetensors checkpoint, not {ckpt.format} (convert it with "
            "`mtpcheck convert megatron-to-hf`)",
        )
    if ckpt.config_path is None:
        raise InputError(ckpt.path, "no config.json: transformers cannot build the main model")
    return Path(ckpt.config_path).parent


def resolve_device(device: str) -> torch.device:
    if device == "cuda" and not torch.cuda.is_available():
        raise MtpcheckError("--device cuda: no CUDA device is available to torch")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device, config: Any) -> torch.dtype:
    """``auto``: float32 on CPU, the checkpoint's stored dtype (else bfloat16) on CUDA."""
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type == "cpu":
        return torch.float32
    stored = config.get("dtype") or config.get("torch_dtype")
    return DTYPES.get(str(stored), torch.bfloat16)


def load_main_model(directory: Path, dtype: torch.dtype, device: torch.device) -> Any:
    """The main model through its transformers class (MTP tensors are left out by it): the
    causal-LM class, or for a vision-language model without one (Step-3.7) its
    image-text-to-text class, whose language model is the same decoder."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from mtpcheck.accept.hf_quiet import quiet_transformers

    try:
        with quiet_transformers():
            config = AutoConfig.from_pretrained(str(directory), local_files_only=True)
            auto = AutoModelForCausalLM
            if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
                auto = AutoModelForImageTextToText
            model = auto.from_pretrained(str(directory), dtype=dtype, local_files_only=True)
    except Exception as e:  # transformers raises many types for a model it cannot build
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(directory, f"transformers cannot load the main model: {reason}") from e
    return model.to(device).eval()


LOGIT_BUDGET = 1 << 27
"""Most logits (batch x length x vocab) one batched forward pass may produce."""
MAX_BATCH = 64


@torch.no_grad()
def score_depths(
    drafter: Drafter, batch: Sequence[Sequence[int]], temperature: float
) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Per sequence, per depth j = 1..D, per slot t in 0..L-1-j: (greedy hit, alpha) of depth
    j's draft for token t+j+1, scored against the main model's distribution at t+j.

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
            p, q = logits[i, j : j + n], q_logits[i, :n]
            row.append((greedy_hits(p, q).cpu(), alpha_per_position(p, q, temperature).cpu()))
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


def measure_online(
    drafter: Drafter, workload: Workload, options: AcceptOptions, label: str
) -> OnlineAcceptance:
    """Draft-then-verify decoding from each sequence's first ``prompt_tokens`` tokens, and the
    teacher-forced verdicts at the positions it drafted (scored on what it generated).

    ``online_engine``: ``mtpcheck``, this package's loop (``accept/online.py``), or
    ``transformers``, ``generate(use_mtp=True)`` with what transformers counts."""
    prompts = [list(s[: options.prompt_tokens]) for s in workload.sequences]
    prompts = [p for p in prompts if len(p) >= 2]
    if not prompts:
        raise MtpcheckError(
            f"workload {workload.name}: no sequence has the {options.prompt_tokens} prompt "
            "tokens --online starts from"
        )
    temperature = options.temperature
    passes: list[tuple[int, int, int]]  # (sequence, slot, drafts counted as accepted)
    if options.online_engine == "transformers":
        from mtpcheck.accept.online_transformers import transformers_decode

        generated = transformers_decode(
            drafter.model, drafter.prefixes, prompts, options.new_tokens, temperature
        )
        sequences, k = generated.sequences, generated.k
        passes = [(s.sequence, s.position - 2, max(0, s.counted)) for s in generated.steps]
        in_output = sum(
            sequences[s.sequence][s.position] == s.drafts[0]
            for s in generated.steps
            if s.position < len(sequences[s.sequence])
        )
    else:
        from mtpcheck.accept.online import speculative_decode

        decoded = speculative_decode(drafter, prompts, options.new_tokens, temperature)
        sequences, k = decoded.sequences, decoded.k
        passes = [(d.sequence, d.slot, d.depth_accepted) for d in decoded.drafts]
        in_output = None
    scored = score_depths(drafter, sequences, temperature)
    greedy = temperature == 0
    leading: list[int] = []  # teacher-forced: drafts 1..j all hit, per pass
    shares = [[0.0, 0] for _ in range(k)]  # per depth: sum of the teacher-forced figure, passes
    for sequence, slot, _ in passes:
        run, product = 0, 1.0
        for j in range(min(k, len(scored[sequence]))):
            hits, alphas = scored[sequence][j]
            if slot >= len(hits):  # past the generated text: nothing left to score
                break
            product *= float(alphas[slot])
            run += int(run == j and bool(hits[slot]))
            shares[j][0] += float(run > j) if greedy else product
            shares[j][1] += 1
        leading.append(run)
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
        teacher_forced=shares[0][0] / shares[0][1] if shares[0][1] else 0.0,
        agreeing=(
            sum(t == taken for t, (_, _, taken) in zip(leading, passes, strict=True))
            if greedy
            else None
        ),
        k=k,
        accepted_per_depth=per_depth if k > 1 else (),
        teacher_forced_per_depth=(
            tuple(total / n if n else 0.0 for total, n in shares) if k > 1 else ()
        ),
        engine=options.online_engine,
        in_output=in_output if greedy else None,
    )


def chain_result(chained: Sequence[ChainCounts], hidden: ChainHidden) -> ChainAcceptance:
    rates = chain_rates(chained)
    depths = tuple(
        DepthAcceptance(
            d,
            g.value,
            g.low,
            g.high,
            a.value,
            a.low,
            a.high,
            1 + sum(r.value for _, r in rates[:d]),
        )
        for d, (g, a) in enumerate(rates, start=1)
    )
    tokens = chain_tokens_per_pass(chained, greedy=False)
    return ChainAcceptance(
        hidden=hidden.value,
        positions=sum(c.positions for c in chained),
        depths=depths,
        tokens_per_pass=tokens.value,
        tokens_per_pass_ci_low=tokens.low,
        tokens_per_pass_ci_high=tokens.high,
        greedy_tokens_per_pass=chain_tokens_per_pass(chained, greedy=True).value,
    )


def result(
    label: str,
    workload: Workload,
    counts: list[SequenceCounts],
    temperature: float,
    note: str,
    chain: ChainAcceptance | None = None,
) -> AcceptanceResult:
    greedy, alpha = greedy_rate(counts), alpha_rate(counts)
    return AcceptanceResult(
        checkpoint=label,
        workload=workload.name,
        drafter=not note,
        note=note,
        sequences=sum(1 for c in counts if c.positions),
        positions=sum(c.positions for c in counts),
        greedy_hits=sum(c.greedy_hits for c in counts),
        greedy=greedy.value,
        greedy_ci_low=greedy.low,
        greedy_ci_high=greedy.high,
        alpha=alpha.value,
        alpha_ci_low=alpha.low,
        alpha_ci_high=alpha.high,
        tokens_per_pass=1.0 + alpha.value,
        temperature=temperature,
        chain=chain,
    )


def _interval(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"


def describe(r: AcceptanceResult) -> str:
    if not r.drafter:
        return f"no drafter ({r.note}): acceptance 0, 1.00 tokens per pass"
    chained = ""
    if r.chain is not None:
        c = r.chain
        chained = (
            f"; {len(c.depths)} MTP layers chained ({c.hidden}): all {len(c.depths)} drafts "
            f"accepted {c.depths[-1].alpha:.3f}, "
            f"{c.tokens_per_pass:.2f}"
            f"{_interval(c.tokens_per_pass_ci_low, c.tokens_per_pass_ci_high)} tokens per pass"
        )
    return (
        f"greedy {r.greedy:.3f}{_interval(r.greedy_ci_low, r.greedy_ci_high)}, "
        f"alpha {r.alpha:.3f}{_interval(r.alpha_ci_low, r.alpha_ci_high)} at T={r.temperature:g}, "
        f"{r.tokens_per_pass:.2f} tokens per pass{chained}; {r.positions} positions in "
        f"{r.sequences} sequences (95% CI over sequences)"
    )


def describe_delta(d: AcceptanceDelta) -> str:
    return (
        f"greedy {d.greedy:+.3f}{_interval(d.greedy_ci_low, d.greedy_ci_high)}, "
        f"alpha {d.alpha:+.3f}{_interval(d.alpha_ci_low, d.alpha_ci_high)}, "
        f"tokens per pass {d.tokens_per_pass:+.3f}"
    )


def _finding(
    r: AcceptanceResult, min_acceptance: float | None, declared: int | None = None
) -> Finding:
    details = {
        "greedy": r.greedy,
        "alpha": r.alpha,
        "tokens_per_pass": r.tokens_per_pass,
        "positions": r.positions,
        "drafter": r.drafter,
    }
    if min_acceptance is not None:
        details["min_acceptance"] = min_acceptance
        if r.alpha < min_acceptance:
            message = f"{describe(r)}; below --min-acceptance {min_acceptance:g}"
            return Finding(r.checkpoint, Status.FAIL, message, details)
    if not r.drafter and declared:
        # the config promises a drafter a serving engine will look for: the gate fails
        message = f"{describe(r)}; the config declares {declared} MTP layer(s)"
        return Finding(r.checkpoint, Status.FAIL, message, details)
    status = Status.PASS if r.drafter else Status.WARN
    return Finding(r.checkpoint, status, describe(r), details)


def load_drafter(
    ckpt: Checkpoint,
    layouts: Sequence[HeadLayout],
    device: torch.device,
    dtype: str = "auto",
    depths: int | None = None,
) -> Drafter:
    """Load the main model through transformers and build its MTP layers (the first
    ``depths`` of them; all by default)."""
    directory = model_directory(ckpt)
    torch_dtype = resolve_dtype(dtype, device, ckpt.config)
    model = load_main_model(directory, torch_dtype, device)
    used = layouts[: depths or len(layouts)]
    heads = [build_head(model, ckpt, layout, torch_dtype, device) for layout in used]
    prefixes = tuple(layout.prefix for layout in layouts)
    return Drafter(model, MtpChain(heads, used[0].chain_hidden), device, prefixes)


def open_drafter(
    path: Path,
    device: str = "cpu",
    dtype: str = "auto",
    depths: int | None = None,
    chain: ChainHidden | None = None,
) -> Drafter | str:
    """The drafter of the checkpoint at ``path``, or why it has none."""
    ckpt = open_checkpoint(path)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    layouts = drafter_layouts(ckpt, analysis, chain)
    if isinstance(layouts, str):
        return layouts
    return load_drafter(ckpt, layouts, resolve_device(device), dtype, depths)


def _check_vocab(workload: Workload, ckpt: Checkpoint) -> None:
    vocab = ckpt.config.get("vocab_size")
    if vocab is None and isinstance(ckpt.config.get("text_config"), dict):
        vocab = ckpt.config["text_config"].get("vocab_size")
    if not isinstance(vocab, int):
        return
    top = max((max(s) for s in workload.sequences if s), default=-1)
    if top >= vocab:
        raise InputError(
            workload.path, f"token id {top} is outside {ckpt.path}'s vocabulary ({vocab} ids)"
        )


def run_accept(options: AcceptOptions, log: Callable[[str], None] = lambda _: None) -> Report:
    """Measure every workload on the checkpoint (and the compared one); build the report."""
    if options.temperature < 0:
        raise MtpcheckError("--temperature must be >= 0")
    device = resolve_device(options.device)
    paths = [options.checkpoint] + ([options.compare] if options.compare is not None else [])
    ckpts = [open_checkpoint(p, options.trust_pickle) for p in paths]
    analyses = [analyse(c.config, c.tensors, c.config_path) for c in ckpts]
    directories = [model_directory(c) for c in ckpts]
    chain = ChainHidden(options.chain) if options.chain else None
    layouts = [drafter_layouts(c, a, chain) for c, a in zip(ckpts, analyses, strict=True)]

    tokenizer = load_tokenizer(options.tokenizer or directories[0])
    workloads = [
        tokenise(name, path, tokenizer, options.max_tokens) for name, path in options.workloads
    ]
    for workload in workloads:
        for ckpt in ckpts:
            _check_vocab(workload, ckpt)

    labels = ("A: ", "B: ") if len(ckpts) == 2 else ("",)
    all_counts: list[dict[str, list[SequenceCounts]]] = []
    results: list[AcceptanceResult] = []
    online: list[OnlineAcceptance] = []
    for ckpt, layout, label in zip(ckpts, layouts, labels, strict=False):
        note = layout if isinstance(layout, str) else ""
        drafter = None
        if not isinstance(layout, str):
            started = time.monotonic()
            drafter = load_drafter(ckpt, layout, device, options.dtype, options.depths)
            seconds = time.monotonic() - started
            depths = drafter.chain.depths
            chained = (
                f"{depths} MTP layers chained ({drafter.chain.chain_hidden.value} hidden state)"
                if depths > 1
                else "MTP head"
            )
            log(f"{label}{ckpt.path}: model and {chained} loaded in {seconds:.1f} s")
        else:
            log(f"{label}{ckpt.path}: no drafter ({note})")
        per_workload = {}
        for workload in workloads:
            positions = sum(max(0, len(ids) - 1) for ids in workload.sequences)
            ticker = (
                Ticker(f"{label}scoring {workload.name}", positions, log, unit="tokens")
                if drafter is not None
                else None
            )
            counts, chained = measure(drafter, workload, options.temperature, ticker)
            per_workload[workload.name] = counts
            chain = (
                chain_result(chained, drafter.chain.chain_hidden)
                if chained and drafter is not None
                else None
            )
            results.append(result(ckpt.path, workload, counts, options.temperature, note, chain))
            if options.online and drafter is not None:
                started = time.monotonic()
                online.append(measure_online(drafter, workload, options, ckpt.path))
                log(
                    f"{label}{workload.name}: online draft-then-verify, {online[-1].drafts} "
                    f"drafts in {time.monotonic() - started:.1f} s"
                )
        all_counts.append(per_workload)
        del drafter

    deltas: list[AcceptanceDelta] = []
    if len(ckpts) == 2:
        for workload in workloads:
            a, b = (c[workload.name] for c in all_counts)
            greedy, alpha = paired_difference(a, b)
            deltas.append(
                AcceptanceDelta(
                    workload=workload.name,
                    greedy=greedy.value,
                    greedy_ci_low=greedy.low,
                    greedy_ci_high=greedy.high,
                    alpha=alpha.value,
                    alpha_ci_low=alpha.low,
                    alpha_ci_high=alpha.high,
                    tokens_per_pass=alpha.value,
                )
            )

    checks = []
    for workload in workloads:
        declared = {c.path: a.declared.value for c, a in zip(ckpts, analyses, strict=True)}
        findings = [
            _finding(r, options.min_acceptance, declared.get(r.checkpoint))
            for r in results
            if r.workload == workload.name
        ]
        findings += [
            Finding("B - A", Status.INFO, describe_delta(d), {"alpha": d.alpha, "greedy": d.greedy})
            for d in deltas
            if d.workload == workload.name
        ]
        checks.append(
            CheckResult(
                f"acceptance/{workload.name}",
                f"MTP acceptance on workload {workload.name}",
                tuple(findings),
            )
        )
    return Report(
        command="accept",
        inputs=tuple(summarise(c, a) for c, a in zip(ckpts, analyses, strict=True)),
        checks=tuple(checks),
        acceptance=tuple(results),
        acceptance_deltas=tuple(deltas),
        online=tuple(online),
    )
