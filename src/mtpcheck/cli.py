"""Command line: parse options, open inputs, run checks, render, map to an exit code."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from mtpcheck import __version__
from mtpcheck.errors import ExitCode, InputError, MtpcheckError
from mtpcheck.model import Report

_FORMATS = ("table", "json")


@dataclass(frozen=True)
class OutputOptions:
    """Where and how a report is written."""

    format: str
    junit_xml: Path | None
    markdown: Path | None
    debug: bool
    trust_pickle: bool = False


def output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every command that produces a report."""
    decorators = [
        click.option(
            "--format",
            "fmt",
            type=click.Choice(_FORMATS),
            default="table",
            show_default=True,
            help="Report format on stdout.",
        ),
        click.option(
            "--junit-xml",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Also write a JUnit XML report (one testcase per check).",
        ),
        click.option(
            "--markdown",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Also write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY).",
        ),
        click.option("--debug", is_flag=True, help="Show tracebacks for errors."),
        click.option(
            "--trust-pickle",
            is_flag=True,
            help="Unpickle Megatron .pt/.metadata files without the allowlist. "
            "Only for files you vouch for: a pickle can run code.",
        ),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def _emit(report: Report, opts: OutputOptions) -> None:
    from mtpcheck.report import STDOUT_RENDERERS, JunitRenderer, MarkdownRenderer

    for renderer, path in ((JunitRenderer(), opts.junit_xml), (MarkdownRenderer(), opts.markdown)):
        if path is not None:
            with open(path, "w", encoding="utf-8") as stream:
                renderer.render(report, stream)
    STDOUT_RENDERERS[opts.format]().render(report, sys.stdout)


def execute(command: str, build: Callable[[], Report], opts: OutputOptions) -> int:
    """Run ``build`` and map its outcome to the documented exit codes."""
    try:
        report = build()
        _emit(report, opts)
    except MtpcheckError as e:
        if opts.debug:
            traceback.print_exc()
        if opts.format == "json":
            from mtpcheck.report import error_dict

            path = e.path if isinstance(e, InputError) else ""
            reason = e.reason if isinstance(e, InputError) else str(e)
            print(json.dumps(error_dict(command, path, reason), indent=2))
        click.echo(f"mtpcheck: error: {e}", err=True)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        click.echo("mtpcheck: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except Exception as e:  # a bug: say so, keep the traceback behind --debug
        if opts.debug:
            traceback.print_exc()
        click.echo(
            f"mtpcheck: internal error: {type(e).__name__}: {e} "
            "(rerun with --debug for a traceback)",
            err=True,
        )
        return ExitCode.INTERNAL
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


def _opts(
    fmt: str, junit_xml: Path | None, markdown: Path | None, debug: bool, trust_pickle: bool
) -> OutputOptions:
    if trust_pickle:
        click.echo(
            "mtpcheck: warning: --trust-pickle: pickled files are loaded without the allowlist "
            "and can run code; use it only for files you vouch for",
            err=True,
        )
    return OutputOptions(fmt, junit_xml, markdown, debug, trust_pickle)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mtpcheck")
def cli() -> None:
    """Prove that a checkpoint's Multi-Token-Prediction (MTP) layers survive."""


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@output_options
def inspect(
    path: Path,
    fmt: str,
    junit_xml: Path | None,
    markdown: Path | None,
    debug: bool,
    trust_pickle: bool,
) -> None:
    """Audit one checkpoint: MTP family, declared count, layers present, shared copies."""

    def build() -> Report:
        from mtpcheck.checks.inspect_checks import inspect_report
        from mtpcheck.formats import open_checkpoint

        return inspect_report(open_checkpoint(path, trust_pickle))

    opts = _opts(fmt, junit_xml, markdown, debug, trust_pickle)
    raise SystemExit(execute("inspect", build, opts))


@cli.command()
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option(
    "--all", "all_tensors", is_flag=True, help="Compare every tensor, not only the MTP scope."
)
@output_options
def diff(
    a: Path,
    b: Path,
    all_tensors: bool,
    fmt: str,
    junit_xml: Path | None,
    markdown: Path | None,
    debug: bool,
    trust_pickle: bool,
) -> None:
    """Compare B against A: config keys, then MTP tensors bit for bit (all with --all).

    A and B may be in different formats (HF safetensors, Megatron torch_dist or legacy):
    the HF side is then mapped to Megatron names, bit-exactly.
    """

    def build() -> Report:
        from mtpcheck.checks.diff_checks import diff_report
        from mtpcheck.formats import open_checkpoint

        left = open_checkpoint(a, trust_pickle)
        return diff_report(left, open_checkpoint(b, trust_pickle), all_tensors=all_tensors)

    opts = _opts(fmt, junit_xml, markdown, debug, trust_pickle)
    if _under_torchrun():
        raise SystemExit(_diff_across_ranks(a, b, all_tensors, opts))
    raise SystemExit(execute("diff", build, opts))


def _under_torchrun() -> bool:
    """``WORLD_SIZE`` > 1: started by torchrun (see benchmarks/README.md, cluster scale)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def _diff_across_ranks(a: Path, b: Path, all_tensors: bool, opts: OutputOptions) -> int:
    """The tensor list split across ranks (torch.distributed, gloo); rank 0 reports."""
    from mtpcheck.pipeline.distributed import diff_across_ranks

    def on_rank0(build: Callable[[], Report]) -> int:
        return execute("diff", build, opts)

    try:
        return diff_across_ranks(a, b, all_tensors, opts.trust_pickle, on_rank0)
    except Exception as e:  # the process group itself failed (rendezvous, timeout)
        click.echo(f"mtpcheck: error: torch.distributed: {type(e).__name__}: {e}", err=True)
        return ExitCode.INTERNAL


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--to-megatron",
    metavar="CMD",
    help="Your HF->Megatron converter, e.g. 'python conv.py --in {src} --out {dst}'. "
    "Default: the built-in converter.",
)
@click.option(
    "--to-hf",
    metavar="CMD",
    help="Your Megatron->HF converter with {src} and {dst}. Default: built-in.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where temporary checkpoints go (default: the system temp dir).",
)
@click.option("--keep", is_flag=True, help="Keep the temporary checkpoints and say where.")
@click.option("--timeout", type=float, metavar="SECONDS", help="Time limit per converter command.")
@click.option(
    "--all",
    "all_tensors",
    is_flag=True,
    help="Compare every tensor of the final checkpoint, not only the MTP scope.",
)
@click.option(
    "--synthetic",
    is_flag=True,
    help="Round-trip a tiny random checkpoint built from PATH's config.json.",
)
@output_options
def roundtrip(
    path: Path,
    to_megatron: str | None,
    to_hf: str | None,
    workdir: Path | None,
    keep: bool,
    timeout: float | None,
    all_tensors: bool,
    synthetic: bool,
    fmt: str,
    junit_xml: Path | None,
    markdown: Path | None,
    debug: bool,
    trust_pickle: bool,
) -> None:
    """HF -> Megatron -> HF through checkpoints on disk; MTP must survive bit for bit."""
    from mtpcheck.pipeline.converter_command import validate_template

    for option, template in (("--to-megatron", to_megatron), ("--to-hf", to_hf)):
        if template is not None:
            try:
                validate_template(template)
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint=option) from e

    def build() -> Report:
        from mtpcheck.pipeline.roundtrip import RoundtripOptions, run_roundtrip

        options = RoundtripOptions(
            source=path,
            to_megatron=to_megatron,
            to_hf=to_hf,
            workdir=workdir,
            keep=keep,
            timeout=timeout,
            all_tensors=all_tensors,
            synthetic=synthetic,
            trust_pickle=trust_pickle,
        )
        return run_roundtrip(options, log=lambda line: click.echo(f"mtpcheck: {line}", err=True))

    opts = _opts(fmt, junit_xml, markdown, debug, trust_pickle)
    raise SystemExit(execute("roundtrip", build, opts))


@cli.group()
def convert() -> None:
    """Built-in converters between HF safetensors and Megatron torch_dist."""


@convert.command("hf-to-megatron")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def hf_to_megatron(src: Path, dst: Path, debug: bool) -> None:
    """Write SRC (HF safetensors) as a Megatron-LM torch_dist checkpoint at DST."""

    def action() -> None:
        from mtpcheck.convert.builtin import hf_to_megatron as run
        from mtpcheck.formats import open_checkpoint

        run(open_checkpoint(src), dst)

    raise SystemExit(run_action(action, debug))


@convert.command("megatron-to-hf")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option(
    "--hf-config",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="config.json of the HF model the Megatron checkpoint holds.",
)
@click.option(
    "--copies/--no-copies",
    default=True,
    show_default=True,
    help="Re-create the MTP copies of embedding and head where the family stores them.",
)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def megatron_to_hf(src: Path, dst: Path, hf_config: Path, copies: bool, debug: bool) -> None:
    """Write SRC (Megatron torch_dist or legacy) as HF sharded safetensors at DST."""

    def action() -> None:
        from mtpcheck.convert.builtin import megatron_to_hf as run
        from mtpcheck.formats import open_checkpoint
        from mtpcheck.formats.config_json import read_config

        run(open_checkpoint(src), dst, read_config(hf_config), copies)

    raise SystemExit(run_action(action, debug))


def run_action(action: Callable[[], None], debug: bool) -> int:
    """Exit-code mapping for commands that write instead of report."""
    try:
        action()
    except MtpcheckError as e:
        if debug:
            traceback.print_exc()
        click.echo(f"mtpcheck: error: {e}", err=True)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        click.echo("mtpcheck: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except Exception as e:
        if debug:
            traceback.print_exc()
        click.echo(f"mtpcheck: internal error: {type(e).__name__}: {e}", err=True)
        return ExitCode.INTERNAL
    return ExitCode.OK


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
@click.option("--device", type=click.Choice(("cpu", "cuda")), default="cpu", show_default=True)
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
@output_options
def accept(
    ckpt: Path,
    workload_specs: tuple[str, ...],
    compare: Path | None,
    temperature: float,
    device: str,
    dtype: str,
    max_tokens: int,
    tokenizer: Path | None,
    min_acceptance: float | None,
    plot: Path | None,
    fmt: str,
    junit_xml: Path | None,
    markdown: Path | None,
    debug: bool,
    trust_pickle: bool,
) -> None:
    """Offline MTP acceptance per workload: does the drafter earn its keep?

    One teacher-forced forward pass per sequence (k = 1): the MTP head's distribution q for
    token t+2 is scored against the main model's distribution p at t+1. Reports greedy
    acceptance, alpha = mean sum_v min(p, q) and 1 + alpha tokens per target pass.
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
        from mtpcheck.accept.runner import AcceptOptions, run_accept

        options = AcceptOptions(
            checkpoint=ckpt,
            workloads=tuple(workloads),
            compare=compare,
            temperature=temperature,
            device=device,
            dtype=dtype,
            max_tokens=max_tokens,
            tokenizer=tokenizer,
            min_acceptance=min_acceptance,
            trust_pickle=trust_pickle,
        )
        report = run_accept(options, log=lambda line: click.echo(f"mtpcheck: {line}", err=True))
        if plot is not None:
            from mtpcheck.accept.plot import write_plot

            write_plot(report, plot)
        return report

    opts = _opts(fmt, junit_xml, markdown, debug, trust_pickle)
    raise SystemExit(execute("accept", build, opts))


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    try:
        cli.main(args=argv, prog_name="mtpcheck", standalone_mode=False)
    except SystemExit as e:
        return int(e.code or 0)
    except click.exceptions.Abort:
        click.echo("mtpcheck: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except click.ClickException as e:
        e.show()
        return ExitCode.BAD_INPUT
    return ExitCode.OK
