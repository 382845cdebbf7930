"""``mtpcheck accept``: offline, teacher-forced MTP acceptance per workload.

One main-model forward pass per sequence gives, at every position, the main model's hidden
state (after its final norm) and its next-token distribution. The MTP head then drafts, for
every position t at once, token t+2 from hidden state t and the embedding of token t+1; the
draft is scored against the main model's distribution at t+1 (k = 1).
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
    MtpHead,
    build_head,
    drafter_layout,
    hidden_and_logits,
)
from mtpcheck.accept.metrics import (
    SequenceCounts,
    alpha_per_position,
    alpha_rate,
    greedy_hits,
    greedy_rate,
    paired_difference,
)
from mtpcheck.accept.workloads import Workload, load_tokenizer, tokenise
from mtpcheck.errors import InputError, MtpcheckError
from mtpcheck.families import analyse, summarise
from mtpcheck.formats import open_checkpoint
from mtpcheck.model import (
    AcceptanceDelta,
    AcceptanceResult,
    Checkpoint,
    CheckResult,
    Finding,
    OnlineAcceptance,
    Report,
    Status,
)
from mtpcheck.ticker import Ticker

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HF_FORMAT = "hf-safetensors"


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


@dataclass(frozen=True)
class Drafter:
    """A loaded main model and its MTP head, ready to score sequences."""

    model: Any
    head: MtpHead
    device: torch.device


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
    """The main model through its transformers class (MTP tensors are left out by it)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(directory), dtype=dtype, local_files_only=True
        )
    except Exception as e:  # transformers raises many types for a model it cannot build
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(directory, f"transformers cannot load the main model: {reason}") from e
    finally:
        hf_logging.set_verbosity(previous)
        hf_logging.enable_progress_bar()
    return model.to(device).eval()


LOGIT_BUDGET = 1 << 27
"""Most logits (batch x length x vocab) one batched forward pass may produce."""
MAX_BATCH = 64


@torch.no_grad()
def score_batch(
    drafter: Drafter, batch: Sequence[Sequence[int]], temperature: float
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence, per position t in 0..L-2: (greedy hit, alpha) of the draft for token t+2.

    Sequences are right-padded into one forward pass: attention is causal and MoE routing is
    per token, so padding after a sequence never reaches its positions.
    """
    width = max(len(ids) for ids in batch)
    rows = [list(ids) + [0] * (width - len(ids)) for ids in batch]
    x = torch.tensor(rows, dtype=torch.long, device=drafter.device)
    hidden, logits = hidden_and_logits(drafter.model, x)
    q_logits = drafter.head(hidden[:, :-1], x[:, 1:])
    scores = []
    for i, ids in enumerate(batch):
        n = len(ids) - 1
        p, q = logits[i, 1 : n + 1], q_logits[i, :n]
        scores.append((greedy_hits(p, q).cpu(), alpha_per_position(p, q, temperature).cpu()))
    return scores


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
) -> list[SequenceCounts]:
    """Counters per sequence; all zeros without a drafter. ``ticker`` counts the positions
    scored."""
    counts = [SequenceCounts(max(0, len(ids) - 1), 0, 0.0) for ids in workload.sequences]
    if drafter is None:
        return counts
    vocab = int(drafter.model.get_output_embeddings().weight.shape[0])
    for group in batches(workload.sequences, vocab):
        scores = score_batch(drafter, [workload.sequences[i] for i in group], temperature)
        for index, (hits, alpha) in zip(group, scores, strict=True):
            counts[index] = SequenceCounts(
                counts[index].positions, int(hits.sum()), float(alpha.sum())
            )
        if ticker is not None:
            ticker.advance(sum(counts[i].positions for i in group), f"sequence {group[-1] + 1}")
    if ticker is not None:
        ticker.finish(f"{len(counts)} sequences")
    return counts


def measure_online(
    drafter: Drafter, workload: Workload, options: AcceptOptions, label: str
) -> OnlineAcceptance:
    """Draft-then-verify decoding from each sequence's first ``prompt_tokens`` tokens, and the
    teacher-forced verdicts at the positions it drafted (scored on what it generated)."""
    from mtpcheck.accept.online import speculative_decode

    prompts = [list(s[: options.prompt_tokens]) for s in workload.sequences]
    prompts = [p for p in prompts if len(p) >= 2]
    if not prompts:
        raise MtpcheckError(
            f"workload {workload.name}: no sequence has the {options.prompt_tokens} prompt "
            "tokens --online starts from"
        )
    decoded = speculative_decode(drafter, prompts, options.new_tokens, options.temperature)
    scored = score_batch(drafter, decoded.sequences, options.temperature)
    hits = [bool(scored[d.sequence][0][d.slot]) for d in decoded.drafts]
    alphas = [float(scored[d.sequence][1][d.slot]) for d in decoded.drafts]
    drafts = len(decoded.drafts)
    accepted = sum(d.accepted for d in decoded.drafts)
    greedy = options.temperature == 0
    return OnlineAcceptance(
        checkpoint=label,
        workload=workload.name,
        temperature=options.temperature,
        sequences=len(prompts),
        prompt_tokens=options.prompt_tokens,
        new_tokens=options.new_tokens,
        drafts=drafts,
        accepted=accepted,
        online=accepted / drafts if drafts else 0.0,
        tokens_per_pass=1 + (accepted / drafts if drafts else 0.0),
        teacher_forced=(sum(hits) if greedy else sum(alphas)) / drafts if drafts else 0.0,
        agreeing=(
            sum(h == d.accepted for h, d in zip(hits, decoded.drafts, strict=True))
            if greedy
            else None
        ),
    )


def result(
    label: str,
    workload: Workload,
    counts: list[SequenceCounts],
    temperature: float,
    note: str,
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
    )


def _interval(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f" [{low:.3f}, {high:.3f}]"


def describe(r: AcceptanceResult) -> str:
    if not r.drafter:
        return f"no drafter ({r.note}): acceptance 0, 1.00 tokens per pass"
    return (
        f"greedy {r.greedy:.3f}{_interval(r.greedy_ci_low, r.greedy_ci_high)}, "
        f"alpha {r.alpha:.3f}{_interval(r.alpha_ci_low, r.alpha_ci_high)} at T={r.temperature:g}, "
        f"{r.tokens_per_pass:.2f} tokens per pass; {r.positions} positions in "
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
    ckpt: Checkpoint, layout: HeadLayout, device: torch.device, dtype: str = "auto"
) -> Drafter:
    """Load the main model through transformers and build its MTP head."""
    directory = model_directory(ckpt)
    torch_dtype = resolve_dtype(dtype, device, ckpt.config)
    model = load_main_model(directory, torch_dtype, device)
    return Drafter(model, build_head(model, ckpt, layout, torch_dtype, device), device)


def open_drafter(path: Path, device: str = "cpu", dtype: str = "auto") -> Drafter | str:
    """The drafter of the checkpoint at ``path``, or why it has none."""
    ckpt = open_checkpoint(path)
    layout = drafter_layout(ckpt, analyse(ckpt.config, ckpt.tensors, ckpt.config_path))
    if isinstance(layout, str):
        return layout
    return load_drafter(ckpt, layout, resolve_device(device), dtype)


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
    layouts = [drafter_layout(c, a) for c, a in zip(ckpts, analyses, strict=True)]

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
            drafter = load_drafter(ckpt, layout, device, options.dtype)
            seconds = time.monotonic() - started
            log(f"{label}{ckpt.path}: model and MTP head loaded in {seconds:.1f} s")
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
            counts = measure(drafter, workload, options.temperature, ticker)
            per_workload[workload.name] = counts
            results.append(result(ckpt.path, workload, counts, options.temperature, note))
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
