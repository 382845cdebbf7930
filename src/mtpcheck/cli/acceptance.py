"""``accept``: MTP acceptance per workload, offline, on vLLM, or on a running server."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mtpcheck import api
from mtpcheck.accept.server_engines import ENGINES
from mtpcheck.cli.app import (
    Decorator,
    OutputOptions,
    apply,
    check_output_path,
    cli,
    defaulted,
    file_option,
    output_options,
    report_and_exit,
)
from mtpcheck.dtypes import COMPUTE_DTYPE_CHOICES
from mtpcheck.extras import require
from mtpcheck.model import Report
from mtpcheck.model.modes import ChainHidden, DraftRule, OnlineEngine
from mtpcheck.settings import VLLM_VENV

if TYPE_CHECKING:
    from mtpcheck.accept.vllm_engine import VllmSettings

SERVER_ENGINES = tuple(ENGINES)


def _at_least(name: str, minimum: int, default: int, help: str) -> Decorator:
    """A whole-number option of at least ``minimum``, its default shown."""
    return defaulted(name, kind=click.IntRange(min=minimum), default=default, help=help)


MEASURE_OPTIONS: list[Decorator] = [
    click.option(
        "--workload",
        "workload_specs",
        metavar="NAME=PATH",
        multiple=True,
        required=True,
        help="A workload: JSONL with 'text' or 'messages', or plain text (repeatable).",
    ),
    click.option(
        "--compare",
        type=click.Path(path_type=Path),
        help="Also measure this checkpoint on the same token sequences and report B - A.",
    ),
    defaulted(
        "--temperature",
        kind=click.FloatRange(min=0),
        default=1.0,
        help="Temperature of p and q for alpha; 0 makes alpha the greedy acceptance.",
    ),
    defaulted(
        "--device",
        kind=click.Choice(("cpu", "cuda")),
        default="cpu",
        help="Where the MTP layers run, and the main model unless --device-map places it.",
    ),
    click.option(
        "--device-map",
        metavar="auto|balanced|sequential|FILE.json",
        help="Spread the main model over every visible GPU and the CPU with accelerate (a "
        "strategy name, or a JSON map of module name -> 'cpu' / 'disk' / GPU index), for models "
        "that fit one node but not one device.",
    ),
    defaulted(
        "--dtype",
        kind=click.Choice(COMPUTE_DTYPE_CHOICES),
        default="auto",
        help="Compute dtype; auto: float32 on CPU, the checkpoint's dtype on CUDA.",
    ),
    _at_least("--max-tokens", 2, 512, "Cut each sequence to this many tokens."),
    click.option(
        "--tokenizer",
        type=click.Path(file_okay=False, path_type=Path),
        help="Tokenizer folder (default: CKPT's); both checkpoints see the same token ids.",
    ),
    click.option(
        "--min-acceptance",
        type=click.FloatRange(min=0, max=1),
        help="CI gate: exit 1 if alpha on any workload (of any checkpoint) is below this.",
    ),
    file_option(
        "--plot", "Also write a PNG bar chart of acceptance per workload (and checkpoint)."
    ),
]
"""The workloads, the checkpoints and how they are measured."""


ONLINE_OPTIONS: list[Decorator] = [
    click.option(
        "--online",
        is_flag=True,
        help="Also run real draft-then-verify decoding from each sequence's first tokens and "
        "report what it accepts beside the teacher-forced figure at the same positions.",
    ),
    _at_least(
        "--prompt-tokens",
        2,
        9,
        "--online: prompt length in tokens (the rest of each sequence is not used).",
    ),
    _at_least("--new-tokens", 1, 40, "--online: tokens to generate after each prompt."),
    click.option(
        "--online-engine",
        type=click.Choice([e.value for e in OnlineEngine]),
        callback=lambda _ctx, _param, value: OnlineEngine(value),
        default="mtpcheck",
        show_default=True,
        help="--online: mtpcheck's own draft-then-verify loop, or transformers' "
        "generate(use_mtp=True) with the counts transformers reports (docs/acceptance/online.md).",
    ),
    click.option(
        "--depths",
        type=click.IntRange(min=1),
        help="Chain at most this many MTP layers (the drafts per verify pass, k); default: all "
        "the checkpoint holds.",
    ),
    click.option(
        "--draft-rule",
        type=click.Choice([r.value for r in DraftRule]),
        callback=lambda _ctx, _param, value: None if value is None else DraftRule(value),
        help="--online: how the drafts are made. engine (default): as vLLM drafts (depth 1 fed "
        "the state the engine feeds, through the main embedding and head; deeper depths see only "
        "the slots they drafted at; one layer reused for more drafts than layers; drafts are "
        "argmax, rejection-sampled at T > 0). training: every depth over every slot, through the "
        "stored copies, drafts sampled from q, as megatron-core trains and the teacher-forced "
        "figures score.",
    ),
    click.option(
        "--chain",
        type=click.Choice([c.value for c in ChainHidden]),
        help="What MTP depth d passes to depth d+1: its output after the layer's final norm or "
        "before it. Default: the rule of the engine that serves the family "
        "(docs/acceptance/depths.md).",
    ),
]
"""``--online``: real draft-then-verify decoding, and the MTP chain."""


ENGINE_OPTIONS: list[Decorator] = [
    click.option(
        "--engine",
        type=click.Choice(("vllm",)),
        help="Measure with the serving engine's own MTP speculative decoding (each sequence's "
        "first --prompt-tokens ids as the prompt, --new-tokens generated, --depths drafts a step; "
        "default k: the MTP layers CKPT holds) and report its counters per workload, instead of "
        "the teacher-forced pass.",
    ),
    click.option(
        "--vllm-python",
        metavar="PYTHON",
        help="--engine vllm: the interpreter that has vLLM >= 0.32 (default: "
        "$MTPCHECK_VLLM_VENV/bin/python where that variable names a venv, else this one; "
        "`pip install mtpcheck[vllm]`).",
    ),
    _at_least("--tensor-parallel-size", 1, 1, "--engine vllm: GPUs per pipeline stage."),
    _at_least(
        "--pipeline-parallel-size",
        1,
        1,
        "--engine vllm: pipeline stages (across nodes with --distributed-executor-backend ray).",
    ),
    click.option(
        "--distributed-executor-backend",
        type=click.Choice(("mp", "ray")),
        help="--engine vllm: vLLM's executor (default: vLLM's choice; ray for several nodes).",
    ),
    click.option(
        "--vllm-arg",
        "vllm_args",
        metavar="KEY=VALUE",
        multiple=True,
        help="--engine vllm: a further vllm.LLM argument, VALUE as JSON where it parses "
        "(repeatable), e.g. max_model_len=4096, gpu_memory_utilization=0.85.",
    ),
    file_option("--engine-log", "--engine vllm: write vLLM's own log here (default: discarded)."),
    click.option(
        "--teacher-forced",
        "engine_teacher_forced",
        is_flag=True,
        help="--engine vllm: also load CKPT with transformers and score the engine's output "
        "teacher-forced at the positions the engine drafted, beside its figure.",
    ),
]
"""``--engine vllm``: the serving engine's own speculative decoding."""


SERVER_OPTIONS: list[Decorator] = [
    click.option(
        "--server",
        "server_url",
        metavar="URL",
        help="Measure on a running OpenAI-compatible server (vLLM, SGLang, llama.cpp) by the "
        "engine's own figures for exactly these requests; CKPT, if given, says what its drafter "
        "should accept there (docs/acceptance/server.md).",
    ),
    click.option(
        "--server-engine",
        type=click.Choice(SERVER_ENGINES),
        help="--server: the engine behind URL (default: told by its /metrics names).",
    ),
    click.option(
        "--server-model",
        metavar="NAME",
        help="--server: the model name to ask for (default: the one the server lists).",
    ),
    click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        help="--server: requests in flight at once (default: 32 where the engine returns "
        "per-request figures; else 1, each request between two reads of its counters).",
    ),
    defaulted(
        "--request-timeout",
        kind=click.FloatRange(min=0, min_open=True),
        default=600.0,
        help="--server: seconds one request may take.",
    ),
    file_option(
        "--save-profile",
        "--server: write the figures per workload and position here, to hold later runs to.",
    ),
    file_option(
        "--profile",
        "--server: fail a workload whose acceptance at a position falls below this saved "
        "profile's by more than both runs' spread allows.",
    ),
    click.option(
        "--drafter",
        type=click.Path(file_okay=False, path_type=Path),
        metavar="DIR",
        help="A separate drafter (EAGLE-3, DFlash, ...) instead of CKPT's MTP layers. With "
        "--engine vllm: vLLM drafts with it (method from its kind, e.g. eagle3; default k: "
        "its config's speculative_tokens). With --server: the drafter the server drafts with, "
        "named with its method in the report (a server does not tell it); give the target as "
        "--tokenizer, not CKPT.",
    ),
]
"""``--server``: a running OpenAI-compatible server."""


@cli.command()
@click.argument("ckpt", type=click.Path(path_type=Path), required=False)
@apply(MEASURE_OPTIONS)
@apply(ONLINE_OPTIONS)
@apply(ENGINE_OPTIONS)
@apply(SERVER_OPTIONS)
@output_options
def accept(opts: OutputOptions, **params: Any) -> None:
    """Offline MTP acceptance per workload: does the drafter earn its keep?

    One teacher-forced forward pass per sequence (k = 1): the MTP head's distribution q for
    token t+2 is scored against the main model's distribution p at t+1. Reports greedy
    acceptance, alpha = mean sum_v min(p, q) and 1 + alpha tokens per target pass. With
    several MTP layers, also the chain's acceptance per depth (k = D). With --online, also
    what real draft-then-verify decoding accepts at the positions it drafts.
    """
    args = AcceptArgs(**params)
    workloads = _workloads(args.workload_specs)
    ctx = click.get_current_context()
    if args.server_url is not None:
        _on_server(ctx, args, workloads, opts)
    given = [o for o in SERVER_ONLY if _given(ctx, o)]
    if given:
        raise click.UsageError(f"--{given[0].replace('_', '-')} needs --server")
    if args.drafter is not None and args.engine is None:
        raise click.UsageError("--drafter needs --server or --engine vllm")
    if args.ckpt is None:
        raise click.UsageError("Missing argument 'CKPT' (only --server runs without one).")
    require("accept", "accept on a checkpoint")
    if args.plot is not None:
        require("plot", "accept --plot")
    vllm = _vllm_settings(args)
    check_output_path("--plot", args.plot)
    check_output_path("--engine-log", args.engine_log)

    def build() -> Report:
        return api.accept(
            args.ckpt,
            workloads,
            compare=args.compare,
            device_map=args.device_map,
            online=args.online,
            online_engine=args.online_engine,
            depths=args.depths,
            draft_rule=args.draft_rule or DraftRule.ENGINE,
            chain=args.chain,
            engine=args.engine,
            vllm=vllm,
            teacher_forced=args.engine_teacher_forced,
            plot=args.plot,
            log=opts.log,
            drafter=args.drafter,
            **_measured(args, opts),
        )

    report_and_exit("accept", build, opts)


@dataclass(frozen=True)
class AcceptArgs:
    """What was given on ``accept``'s command line, but the output options."""

    ckpt: Path | None
    workload_specs: tuple[str, ...]
    compare: Path | None
    temperature: float
    device: str
    device_map: str | None
    dtype: str
    max_tokens: int
    tokenizer: Path | None
    min_acceptance: float | None
    plot: Path | None
    online: bool
    prompt_tokens: int
    new_tokens: int
    online_engine: OnlineEngine
    depths: int | None
    draft_rule: DraftRule | None
    chain: str | None
    engine: str | None
    vllm_python: str | None
    tensor_parallel_size: int
    pipeline_parallel_size: int
    distributed_executor_backend: str | None
    vllm_args: tuple[str, ...]
    engine_log: Path | None
    engine_teacher_forced: bool
    server_url: str | None
    server_engine: str | None
    server_model: str | None
    concurrency: int | None
    request_timeout: float
    save_profile: Path | None
    profile: Path | None
    drafter: Path | None


def _workloads(specs: tuple[str, ...]) -> tuple[tuple[str, Path], ...]:
    """``--workload NAME=PATH`` parsed, the names unique."""
    from mtpcheck.accept.workloads import parse_spec

    try:
        workloads = tuple(parse_spec(spec) for spec in specs)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--workload") from e
    names = [name for name, _ in workloads]
    if len(set(names)) != len(names):
        raise click.BadParameter("workload names must be unique", param_hint="--workload")
    return workloads


def _measured(args: AcceptArgs, opts: OutputOptions) -> dict[str, Any]:
    """The keywords of :func:`mtpcheck.api.accept` that every way of measuring takes."""
    return {
        "temperature": args.temperature,
        "device": args.device,
        "dtype": args.dtype,
        "max_tokens": args.max_tokens,
        "tokenizer": args.tokenizer,
        "min_acceptance": args.min_acceptance,
        "trust_pickle": opts.trust_pickle,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
    }


def _vllm_settings(args: AcceptArgs) -> VllmSettings:
    """``--engine vllm``'s settings; its options refused without it, and the options it
    replaces refused with it."""
    from mtpcheck.accept.vllm_engine import VllmSettings, parse_vllm_arg

    try:
        extra = tuple(parse_vllm_arg(a) for a in args.vllm_args)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--vllm-arg") from e
    engine_only = {
        "--vllm-python": args.vllm_python is not None,
        "--tensor-parallel-size": args.tensor_parallel_size != 1,
        "--pipeline-parallel-size": args.pipeline_parallel_size != 1,
        "--distributed-executor-backend": args.distributed_executor_backend is not None,
        "--vllm-arg": bool(args.vllm_args),
        "--engine-log": args.engine_log is not None,
        "--teacher-forced": args.engine_teacher_forced,
    }
    clashing = {
        "--online": args.online,
        "--device-map": args.device_map is not None,
        "--chain": args.chain is not None,
        "--online-engine": args.online_engine != OnlineEngine.MTPCHECK,
        "--draft-rule": args.draft_rule is not None,
    }
    if args.engine is None:
        given = [name for name, used in engine_only.items() if used]
        if given:
            raise click.UsageError(f"{given[0]} needs --engine vllm")
    else:
        given = [name for name, used in clashing.items() if used]
        if given:
            raise click.UsageError(f"{given[0]} does not apply to --engine {args.engine}")
        if args.drafter is not None:
            mtp_only = {"--teacher-forced": args.engine_teacher_forced,
                        "--compare": args.compare is not None}  # fmt: skip
            given = [name for name, used in mtp_only.items() if used]
            if given:
                raise click.UsageError(
                    f"{given[0]} does not apply to --drafter: mtpcheck scores and compares a "
                    "checkpoint's own MTP layers only"
                )
    return VllmSettings(
        python=args.vllm_python or _venv_python() or sys.executable,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        executor=args.distributed_executor_backend,
        dtype=args.dtype,
        extra=extra,
        log=args.engine_log,
    )


#: Options of the running-server path only.
SERVER_ONLY = (
    "server_engine", "server_model", "concurrency", "request_timeout", "save_profile", "profile",
)  # fmt: skip
#: Options of the other paths that mean nothing on a running server.
NOT_ON_SERVER = (
    "compare", "device_map", "plot", "online", "online_engine", "depths", "draft_rule", "chain",
    "engine", "vllm_python", "tensor_parallel_size", "pipeline_parallel_size",
    "distributed_executor_backend", "vllm_args", "engine_log", "engine_teacher_forced",
)  # fmt: skip


def _given(ctx: click.Context, name: str) -> bool:
    """Whether option ``name`` was given (on the command line or by its variable)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source is not click.core.ParameterSource.DEFAULT


def _refuse_outside_server(ctx: click.Context) -> None:
    """A usage error naming the first option given that means nothing on a server."""
    for name in NOT_ON_SERVER:
        if _given(ctx, name):
            option = next(p for p in ctx.command.params if p.name == name)
            flag = option.opts[0] if option.opts else name
            raise click.UsageError(f"{flag} does not apply to --server")


def _on_server(
    ctx: click.Context,
    args: AcceptArgs,
    workloads: tuple[tuple[str, Path], ...],
    opts: OutputOptions,
) -> None:
    """``accept --server``: the options that apply there, checked, then the run."""
    from mtpcheck.accept.options import ServerOptions

    _refuse_outside_server(ctx)
    assert args.server_url is not None
    server = ServerOptions(
        url=args.server_url,
        engine=args.server_engine,
        model=args.server_model,
        timeout=args.request_timeout,
        concurrency=args.concurrency,
        save_profile=args.save_profile,
        profile=args.profile,
        drafter=args.drafter,
    )
    if args.drafter is not None and args.ckpt is not None:
        raise click.UsageError(
            "--drafter with CKPT: the offline expectation is computed for a checkpoint's own MTP "
            "layers only; give the target as --tokenizer instead"
        )
    check_output_path("--save-profile", args.save_profile)

    def build() -> Report:
        return api.accept(
            args.ckpt, workloads, server=server, log=opts.log, **_measured(args, opts)
        )

    report_and_exit("accept", build, opts)


def _venv_python() -> str | None:
    """The interpreter of the venv ``MTPCHECK_VLLM_VENV`` names (vLLM's pins often need a
    venv of their own), or None."""
    venv = VLLM_VENV.value()
    return str(venv / "bin" / "python") if venv is not None else None
