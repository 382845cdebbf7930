"""``accept``: offline MTP acceptance per workload."""

from __future__ import annotations

from pathlib import Path

import click

from mtpcheck.cli.app import check_output_path, cli, execute, make_options, output_options
from mtpcheck.model import Report


@cli.command()
@click.argument("ckpt", type=click.Path(path_type=Path))
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
    "generate(use_mtp=True) with the counts transformers reports (see README).",
)
@click.option(
    "--depths",
    type=click.IntRange(min=1),
    help="Chain at most this many MTP layers (the drafts per verify pass, k); default: all "
    "the checkpoint holds.",
)
@click.option(
    "--draft-rule",
    type=click.Choice(("training", "engine")),
    default="training",
    show_default=True,
    help="--online: how depths 2..k draft: every depth over every slot, as megatron-core "
    "trains (training), or as vLLM drafts: deeper depths see only the slots they drafted at, "
    "and one layer is reused for more drafts than layers (engine; greedy).",
)
@click.option(
    "--chain",
    type=click.Choice(("post-norm", "pre-norm")),
    help="What MTP depth d passes to depth d+1: its output after the layer's final norm or "
    "before it. Default: the rule of the engine that serves the family (see README).",
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
    draft_rule: str,
    chain: str | None,
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

    def build() -> Report:
        from mtpcheck.accept.preflight import preflight

        checkpoints = [ckpt] if compare is None else [ckpt, compare]
        preflight(checkpoints, [path for _, path in workloads], trust_pickle)
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
            draft_rule=draft_rule,
            chain=chain,
        )
        report = run_accept(options, log=opts.log)
        if plot is not None:
            from mtpcheck.accept.plot import write_plot

            write_plot(report, plot)
        return report

    check_output_path("--plot", plot)
    opts = make_options(fmt, junit_xml, markdown, debug, trust_pickle, quiet)
    raise SystemExit(execute("accept", build, opts))
