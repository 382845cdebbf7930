"""``accept --server``: acceptance per workload and per draft position on a server a team
already runs, by the engine's own figures for exactly mtpcheck's requests.

Each workload's prompts go to the server's OpenAI completions endpoint, one workload at a
time (:mod:`mtpcheck.accept.server_requests`); the engine's figures become shares per
position with intervals over requests. They are then held to what is expected of them:
``--min-acceptance``, a saved profile (``--profile``), and, with CKPT, what the checkpoint's
own drafter accepts offline on the same prompts by vLLM's draft rule, which tells whose
loss a shortfall is: the checkpoint's drafter, or the engine serving it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import cast

from mtpcheck.accept.drafter import Drafter
from mtpcheck.accept.options import AcceptOptions, ServerOptions
from mtpcheck.accept.server_engines import ServedRequest
from mtpcheck.accept.server_http import Server
from mtpcheck.accept.server_identity import Served, identify
from mtpcheck.accept.server_profile import Held
from mtpcheck.accept.server_requests import Prompt, Sent, send_workload
from mtpcheck.accept.server_verdicts import workload_check
from mtpcheck.accept.stats import ratio_estimate, ratio_share
from mtpcheck.errors import InputError
from mtpcheck.model import CheckpointSummary, CheckResult, Report, ServerAcceptance, Share


def summarise_workload(
    name: str, served: Served, server: str, sent: Sent, options: AcceptOptions, tokens: bool
) -> ServerAcceptance:
    """Pooled figures of one workload, with intervals over its requests."""
    rs = sent.requests
    steps = [r.drafts for r in rs]
    counted = all(s is not None for s in steps)
    per_position = [r.accepted_per_position for r in rs]
    k = max((len(p) for p in per_position if p is not None), default=0) or None
    positions: tuple[int, ...] = ()
    by_position: tuple[Share, ...] = ()
    if counted and k and all(p is not None for p in per_position):
        padded = [tuple(p) + (0,) * (k - len(p)) for p in per_position if p is not None]
        positions = tuple(sum(p[i] for p in padded) for i in range(k))
        known = cast(list[int], steps)  # all counted
        by_position = tuple(ratio_share([p[i] for p in padded], known) for i in range(k))
    drafts = sum(s for s in steps if s is not None) if counted else None
    if k is None and drafts:
        whole, rest = divmod(sum(r.draft_tokens for r in rs), drafts)
        k = whole if not rest else None
    length = None
    if counted and drafts:
        upper = 1.0 + (k or max(r.draft_tokens for r in rs))
        length = ratio_estimate(
            [s + r.accepted_tokens for s, r in zip(steps, rs, strict=True)],  # type: ignore[operator]
            steps,  # type: ignore[arg-type]
            bounds=(1.0, upper),
        )
    return ServerAcceptance(
        workload=name,
        engine=served.title,
        server=server,
        model=served.model,
        source=sent.source,
        temperature=options.temperature,
        requests=len(rs),
        prompt_tokens=options.prompt_tokens if tokens else None,
        new_tokens=options.new_tokens,
        generated_tokens=sum(r.generated_tokens for r in rs),
        k=k,
        drafts=drafts,
        draft_tokens=sum(r.draft_tokens for r in rs),
        accepted_tokens=sum(r.accepted_tokens for r in rs),
        accepted_per_position=positions,
        by_position=by_position,
        acceptance=ratio_share([r.accepted_tokens for r in rs], [r.draft_tokens for r in rs]),
        mean_acceptance_length=length,
    )


def _prompts(options: AcceptOptions, log: Callable[[str], None]) -> dict[str, list[Prompt]]:
    """Token ids (each sequence's first ``--prompt-tokens``) where a tokenizer is at hand
    (CKPT's or ``--tokenizer``), else each record's text."""
    from mtpcheck.accept.workloads import read_records

    if options.checkpoint is None and options.tokenizer is None:
        prompts: dict[str, list[Prompt]] = {}
        for name, path in options.workloads:
            records = read_records(path)
            if any(not isinstance(r, str) for r in records):
                raise InputError(
                    path,
                    "chat 'messages' need the model's chat template: give CKPT or --tokenizer DIR",
                )
            if not records:
                raise InputError(path, "workload holds no text")
            prompts[name] = list(records)  # type: ignore[arg-type]
        log("no tokenizer (CKPT or --tokenizer): prompts go as text, whole")
        return prompts
    from mtpcheck.accept.workloads import load_tokenizer, tokenise

    directory = options.tokenizer
    if directory is None:
        from mtpcheck.accept.loading import model_directory
        from mtpcheck.formats import open_checkpoint

        assert options.checkpoint is not None
        directory = model_directory(open_checkpoint(options.checkpoint, options.trust_pickle))
    tokenizer = load_tokenizer(directory)
    out: dict[str, list[Prompt]] = {}
    for name, path in options.workloads:
        workload = tokenise(name, path, tokenizer, options.max_tokens)
        out[name] = [list(s[: options.prompt_tokens]) for s in workload.sequences if len(s) >= 2]
        if not out[name]:
            raise InputError(path, "no sequence has two tokens to start from")
    return out


def run_server_accept(
    options: AcceptOptions, settings: ServerOptions, log: Callable[[str], None] = lambda _: None
) -> Report:
    """Every workload through the server; figures, expectations and verdicts."""
    drafter = None
    if settings.drafter is not None:
        from mtpcheck.accept.drafter import identify_drafter

        if options.checkpoint is not None:
            raise InputError(
                options.checkpoint,
                "CKPT with --drafter: the offline expectation is computed for a checkpoint's "
                "own MTP layers only, not for a separate drafter; give the target as "
                "--tokenizer instead",
            )
        drafter = identify_drafter(settings.drafter, options.trust_pickle)
        log(drafter.described())
    server = Server.at(settings.url, settings.timeout)
    served = identify(server, settings.engine, settings.model)
    log(f"{server.base}: {served.title}, model {served.model}")
    prompts = _prompts(options, log)
    tokens = options.checkpoint is not None or options.tokenizer is not None
    results = []
    for name, _ in options.workloads:
        batch = prompts[name]
        log(f"{name}: {len(batch)} requests")
        sent = send_workload(
            server,
            served.engine,
            served.model,
            batch,
            options.new_tokens,
            options.temperature,
            settings.concurrency,
        )
        result = summarise_workload(name, served, server.base, sent, options, tokens)
        log(f"{name}: {result.draft_tokens} draft tokens, {result.accepted_tokens} accepted "
            f"({sent.source})")  # fmt: skip
        results.append((result, sent))
    inputs: tuple[CheckpointSummary, ...] = ()
    if options.checkpoint is not None:
        from mtpcheck.accept.server_expectation import expectations

        figures = [r for r, _ in results]
        expected, summary = expectations(
            options, [prompts[r.workload] for r in figures], figures, log
        )
        inputs = (summary,)
        results = [(replace(r, expected=e), s) for (r, s), e in zip(results, expected, strict=True)]
    if drafter is not None:
        results = [(replace(r, drafter=drafter.title), s) for r, s in results]
    report = _report(
        tuple(r for r, _ in results), [s for _, s in results], options, settings, drafter
    )
    return replace(report, inputs=inputs)


def _report(
    results: tuple[ServerAcceptance, ...],
    sent: list[Sent],
    options: AcceptOptions,
    settings: ServerOptions,
    drafter: Drafter | None = None,
) -> Report:
    from mtpcheck.accept.server_profile import hold_to_profile, load_profile, save_profile

    held: list[Held] = []
    absent: list[str] = []
    if settings.profile is not None:
        profile = load_profile(settings.profile)
        held, absent = hold_to_profile(results, profile, settings.profile)
    comparisons = sum(len(r.expected) for r in results)
    checks: list[CheckResult] = [
        workload_check(
            r,
            s.note,
            options.min_acceptance,
            held,
            r.workload in absent,
            settings.profile,
            comparisons,
            drafter,
        )  # fmt: skip
        for r, s in zip(results, sent, strict=True)
    ]
    if settings.save_profile is not None:
        save_profile(results, settings.save_profile)
    return Report(command="accept", inputs=(), checks=tuple(checks), server=results)


__all__ = ["ServedRequest", "ServerOptions", "run_server_accept"]
