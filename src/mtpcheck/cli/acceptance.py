"""``accept``: MTP acceptance per workload, offline, on vLLM, or on a running server."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mtpcheck.accept.server_engines import ENGINES
from mtpcheck.cli.app import check_output_path, cli, execute, make_options, output_options
from mtpcheck.extras import require
from mtpcheck.model import Report

if TYPE_CHECKING:
    from mtpcheck.accept.options import AcceptOptions

SERVER_ENGINES = tuple(ENGINES)


@cli.command()
@click.argument("ckpt", type=click.Path(path_type=Path), required=False)
@click.option(
    "--workload",
    "workload_specs",
    metavar="NAME=PATH",
    multiple=True,
    required=True,
    help="A workload: JSONL with 'text' or 'messages', or plain text (repeatable).",
)
@click.option(
    "--compare",
    type=click.Path(path_type=Path),
    help="Also measure this checkpoint on the same token sequences and report B - A.",
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Temperature of p and q for alpha; 0 makes alpha the greedy acceptance.",
)
@click.option(
    "--device",
    type=click.Choice(("cpu", "cuda")),
    default="cpu",
    show_default=True,
    help="Where the MTP layers run, and the main model unless --device-map places it.",
)
@click.option(
    "--device-map",
    metavar="auto|balanced|sequential|FILE.json",
    help="Spread the main model over every visible GPU and the CPU with accelerate (a "
    "strategy name, or a JSON map of module name -> 'cpu' / 'disk' / GPU index), for models "
    "that fit one node but not one device.",
)
@click.option(
    "--dtype",
    type=click.Choice(("auto", "float32", "bfloat16", "float16")),
    default="auto",
    show_default=True,
    help="Compute dtype; auto: float32 on CPU, the checkpoint's dtype on CUDA.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=2),
    default=512,
    show_default=True,
    help="Cut each sequence to this many tokens.",
)
@click.option(
    "--tokenizer",
    type=click.Path(file_okay=False, path_type=Path),
    help="Tokenizer folder (default: CKPT's); both checkpoints see the same token ids.",
)
@click.option(
    "--min-acceptance",
    type=click.FloatRange(min=0, max=1),
    help="CI gate: exit 1 if alpha on any workload (of any checkpoint) is below this.",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write a PNG bar chart of acceptance per workload (and checkpoint).",
)
@click.option(
    "--online",
    is_flag=True,
    help="Also run real draft-then-verify decoding from each sequence's first tokens and "
    "report what it accepts beside the teacher-forced figure at the same positions.",
)
@click.option(
    "--prompt-tokens",
    type=click.IntRange(min=2),
    default=9,
    show_default=True,
    help="--online: prompt length in tokens (the rest of each sequence is not used).",
)
@click.option(
    "--new-tokens",
    type=click.IntRange(min=1),
    default=40,
    show_default=True,
    help="--online: tokens to generate after each prompt.",
)
@click.option(
    "--online-engine",
    type=click.Choice(("mtpcheck", "transformers")),
    default="mtpcheck",
    show_default=True,
    help="--online: mtpcheck's own draft-then-verify loop, or transformers' "
    "generate(use_mtp=True) with the counts transformers reports (docs/acceptance/online.md).",
)
@click.option(
    "--depths",
    type=click.IntRange(min=1),
    help="Chain at most this many MTP layers (the drafts per verify pass, k); default: all "
    "the checkpoint holds.",
)
@click.option(
    "--draft-rule",
    type=click.Choice(("engine", "training")),
    help="--online: how the drafts are made. engine (default): as vLLM drafts (depth 1 fed "
    "the state the engine feeds, through the main embedding and head; deeper depths see only "
    "the slots they drafted at; one layer reused for more drafts than layers; drafts are "
    "argmax, rejection-sampled at T > 0). training: every depth over every slot, through the "
    "stored copies, drafts sampled from q, as megatron-core trains and the teacher-forced "
    "figures score.",
)
@click.option(
    "--chain",
    type=click.Choice(("post-norm", "pre-norm")),
    help="What MTP depth d passes to depth d+1: its output after the layer's final norm or "
    "before it. Default: the rule of the engine that serves the family "
    "(docs/acceptance/depths.md).",
)
@click.option(
    "--engine",
    type=click.Choice(("vllm",)),
    help="Measure with the serving engine's own MTP speculative decoding (each sequence's "
    "first --prompt-tokens ids as the prompt, --new-tokens generated, --depths drafts a step; "
    "default k: the MTP layers CKPT holds) and report its counters per workload, instead of "
    "the teacher-forced pass.",
)
@click.option(
    "--vllm-python",
    metavar="PYTHON",
    help="--engine vllm: the interpreter that has vLLM >= 0.32 (default: "
    "$MTPCHECK_VLLM_VENV/bin/python where that variable names a venv, else this one; "
    "`pip install mtpcheck[vllm]`).",
)
@click.option(
    "--tensor-parallel-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="--engine vllm: GPUs per pipeline stage.",
)
@click.option(
    "--pipeline-parallel-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="--engine vllm: pipeline stages (across nodes with --distributed-executor-backend ray).",
)
@click.option(
    "--distributed-executor-backend",
    type=click.Choice(("mp", "ray")),
    help="--engine vllm: vLLM's executor (default: vLLM's choice; ray for several nodes).",
)
@click.option(
    "--vllm-arg",
    "vllm_args",
    metavar="KEY=VALUE",
    multiple=True,
    help="--engine vllm: a further vllm.LLM argument, VALUE as JSON where it parses "
    "(repeatable), e.g. max_model_len=4096, gpu_memory_utilization=0.85.",
)
@click.option(
    "--engine-log",
    type=click.Path(dir_okay=False, path_type=Path),
    help="--engine vllm: write vLLM's own log here (default: discarded).",
)
@click.option(
    "--teacher-forced",
    "engine_teacher_forced",
    is_flag=True,
    help="--engine vllm: also load CKPT with transformers and score the engine's output "
    "teacher-forced at the positions the engine drafted, beside its figure.",
)
@click.option(
    "--server",
    "server_url",
    metavar="URL",
    help="Measure on a running OpenAI-compatible server (vLLM, SGLang, llama.cpp) by the "
    "engine's own figures for exactly these requests; CKPT, if given, says what its drafter "
    "should accept there (docs/acceptance/server.md).",
)
@click.option(
    "--server-engine",
    type=click.Choice(SERVER_ENGINES),
    help="--server: the engine behind URL (default: told by its /metrics names).",
)
@click.option(
    "--server-model",
    metavar="NAME",
    help="--server: the model name to ask for (default: the one the server lists).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    help="--server: requests in flight at once (default: 32 where the engine returns "
    "per-request figures; else 1, each request between two reads of its counters).",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="--server: seconds one request may take.",
)
@click.option(
    "--save-profile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="--server: write the figures per workload and position here, to hold later runs to.",
)
@click.option(
    "--profile",
    type=click.Path(dir_okay=False, path_type=Path),
    help="--server: fail a workload whose acceptance at a position falls below this saved "
    "profile's by more than both runs' spread allows.",
)
@output_options
def accept(
    ckpt: Path,
    workload_specs: tuple[str, ...],
    compare: Path | None,
    temperature: float,
    device: str,
    device_map: str | None,
    dtype: str,
    max_tokens: int,
    tokenizer: Path | None,
    min_acceptance: float | None,
    plot: Path | None,
    online: bool,
    prompt_tokens: int,
    new_tokens: int,
    online_engine: str,
    depths: int | None,
    draft_rule: str | None,
    chain: str | None,
    engine: str | None,
    vllm_python: str | None,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    distributed_executor_backend: str | None,
    vllm_args: tuple[str, ...],
    engine_log: Path | None,
    engine_teacher_forced: bool,
    server_url: str | None,
    server_engine: str | None,
    server_model: str | None,
    concurrency: int | None,
    request_timeout: float,
    save_profile: Path | None,
    profile: Path | None,
    fmt: str,
    junit_xml: Path | None,
    markdown: Path | None,
    debug: bool,
    trust_pickle: bool,
    quiet: bool,
) -> None:
    """Offline MTP acceptance per workload: does the drafter earn its keep?

    One teacher-forced forward pass per sequence (k = 1): the MTP head's distribution q for
    token t+2 is scored against the main model's distribution p at t+1. Reports greedy
    acceptance, alpha = mean sum_v min(p, q) and 1 + alpha tokens per target pass. With
    several MTP layers, also the chain's acceptance per depth (k = D). With --online, also
    what real draft-then-verify decoding accepts at the positions it drafts.
    """
    from mtpcheck.accept.workloads import parse_spec

    try:
        workloads = [parse_spec(spec) for spec in workload_specs]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--workload") from e
    names = [name for name, _ in workloads]
    if len(set(names)) != len(names):
        raise click.BadParameter("workload names must be unique", param_hint="--workload")
    if server_url is not None:
        raise SystemExit(_on_server(click.get_current_context(), tuple(workloads)))
    ctx = click.get_current_context()
    given = [o for o in SERVER_ONLY if _given(ctx, o)]
    if given:
        raise click.UsageError(f"--{given[0].replace('_', '-')} needs --server")
    if ckpt is None:
        raise click.UsageError("Missing argument 'CKPT' (only --server runs without one).")
    require("accept", "accept on a checkpoint")
    if plot is not None:
        require("plot", "accept --plot")
    from mtpcheck.accept.vllm_engine import VllmSettings, parse_vllm_arg

    try:
        extra = tuple(parse_vllm_arg(a) for a in vllm_args)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--vllm-arg") from e
    engine_only = {
        "--vllm-python": vllm_python is not None,
        "--tensor-parallel-size": tensor_parallel_size != 1,
        "--pipeline-parallel-size": pipeline_parallel_size != 1,
        "--distributed-executor-backend": distributed_executor_backend is not None,
        "--vllm-arg": bool(vllm_args),
        "--engine-log": engine_log is not None,
        "--teacher-forced": engine_teacher_forced,
    }
    if engine is None:
        given = [name for name, used in engine_only.items() if used]
        if given:
            raise click.UsageError(f"{given[0]} needs --engine vllm")
    else:
        clashing = {
            "--online": online,
            "--device-map": device_map is not None,
            "--chain": chain is not None,
            "--online-engine": online_engine != "mtpcheck",
            "--draft-rule": draft_rule is not None,
        }
        given = [name for name, used in clashing.items() if used]
        if given:
            raise click.UsageError(f"{given[0]} does not apply to --engine {engine}")
    vllm = VllmSettings(
        python=vllm_python or _venv_python() or sys.executable,
        tensor_parallel_size=tensor_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        executor=distributed_executor_backend,
        dtype=dtype,
        extra=extra,
        log=engine_log,
    )

    def build() -> Report:
        from mtpcheck.accept.preflight import preflight

        checkpoints = [ckpt] if compare is None else [ckpt, compare]
        opened = preflight(checkpoints, [path for _, path in workloads], trust_pickle)
        from mtpcheck.pipeline.whole_source import require_whole_main_model

        for checkpoint in opened:
            require_whole_main_model(checkpoint)
        from mtpcheck.accept.options import AcceptOptions
        from mtpcheck.accept.runner import run_accept

        options = AcceptOptions(
            checkpoint=ckpt,
            workloads=tuple(workloads),
            compare=compare,
            temperature=temperature,
            device=device,
            device_map=device_map,
            dtype=dtype,
            max_tokens=max_tokens,
            tokenizer=tokenizer,
            min_acceptance=min_acceptance,
            trust_pickle=trust_pickle,
            online=online,
            prompt_tokens=prompt_tokens,
            new_tokens=new_tokens,
            online_engine=online_engine,
            depths=depths,
            draft_rule=draft_rule or "engine",
            chain=chain,
            engine=engine,
            vllm=vllm,
            teacher_forced=engine_teacher_forced,
        )
        report = run_accept(options, log=opts.log)
        if plot is not None:
            from mtpcheck.accept.plot import write_plot

            write_plot(report, plot)
        return report

    check_output_path("--plot", plot)
    check_output_path("--engine-log", engine_log)
    opts = make_options(fmt, junit_xml, markdown, debug, trust_pickle, quiet)
    raise SystemExit(execute("accept", build, opts))


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
    source = ctx.get_parameter_source(name)
    return source is not None and source is not click.core.ParameterSource.DEFAULT


def _refuse_outside_server(ctx: click.Context) -> None:
    for name in NOT_ON_SERVER:
        if _given(ctx, name):
            option = next(p for p in ctx.command.params if p.name == name)
            flag = option.opts[0] if option.opts else name
            raise click.UsageError(f"{flag} does not apply to --server")


def _on_server(ctx: click.Context, workloads: tuple[tuple[str, Path], ...]) -> int:
    """``accept --server``: the options that apply there, checked, then the run."""
    from mtpcheck.accept.options import AcceptOptions, ServerOptions

    _refuse_outside_server(ctx)
    p = ctx.params
    options = AcceptOptions(
        checkpoint=p["ckpt"],
        workloads=workloads,
        temperature=p["temperature"],
        device=p["device"],
        dtype=p["dtype"],
        max_tokens=p["max_tokens"],
        tokenizer=p["tokenizer"],
        min_acceptance=p["min_acceptance"],
        trust_pickle=p["trust_pickle"],
        prompt_tokens=p["prompt_tokens"],
        new_tokens=p["new_tokens"],
        server=ServerOptions(
            url=p["server_url"],
            engine=p["server_engine"],
            model=p["server_model"],
            timeout=p["request_timeout"],
            concurrency=p["concurrency"],
            save_profile=p["save_profile"],
            profile=p["profile"],
        ),
    )
    check_output_path("--save-profile", p["save_profile"])
    opts = make_options(
        p["fmt"], p["junit_xml"], p["markdown"], p["debug"], p["trust_pickle"], p["quiet"]
    )
    return execute("accept", lambda: _server_report(options, opts.log), opts)


def _server_report(options: AcceptOptions, log: Callable[[str], None]) -> Report:
    """Check the inputs (CKPT opens whole, workloads read), then measure on the server."""
    assert options.server is not None
    if options.checkpoint is not None:
        require("accept", "accept --server with CKPT (its offline expectation)")
        from mtpcheck.accept.preflight import preflight
        from mtpcheck.pipeline.whole_source import require_whole_main_model

        for checkpoint in preflight([options.checkpoint], [p for _, p in options.workloads],
                                    options.trust_pickle):  # fmt: skip
            require_whole_main_model(checkpoint)
    from mtpcheck.accept.server_runner import run_server_accept

    return run_server_accept(options, options.server, log)


def _venv_python() -> str | None:
    """The interpreter of the venv ``MTPCHECK_VLLM_VENV`` names (vLLM's pins often need a
    venv of their own), or None."""
    venv = os.environ.get("MTPCHECK_VLLM_VENV")
    return str(Path(venv, "bin", "python")) if venv else None
