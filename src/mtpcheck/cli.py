"""Command line: parse options, open inputs, run checks, render, map to an exit code."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from mtpcheck import __version__
from mtpcheck.errors import ExitCode, InputError
from mtpcheck.model import Report

_FORMATS = ("table", "json")


@dataclass(frozen=True)
class OutputOptions:
    """Where and how a report is written."""

    format: str
    junit_xml: Path | None
    markdown: Path | None
    debug: bool


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
    except InputError as e:
        if opts.debug:
            traceback.print_exc()
        if opts.format == "json":
            from mtpcheck.report import error_dict

            print(json.dumps(error_dict(command, e.path, e.reason), indent=2))
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


def _opts(fmt: str, junit_xml: Path | None, markdown: Path | None, debug: bool) -> OutputOptions:
    return OutputOptions(format=fmt, junit_xml=junit_xml, markdown=markdown, debug=debug)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mtpcheck")
def cli() -> None:
    """Prove that a checkpoint's Multi-Token-Prediction (MTP) layers survive."""


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@output_options
def inspect(
    path: Path, fmt: str, junit_xml: Path | None, markdown: Path | None, debug: bool
) -> None:
    """Audit one checkpoint: MTP family, declared count, layers present, shared copies."""

    def build() -> Report:
        from mtpcheck.checks.inspect_checks import inspect_report
        from mtpcheck.formats import open_checkpoint

        return inspect_report(open_checkpoint(path))

    raise SystemExit(execute("inspect", build, _opts(fmt, junit_xml, markdown, debug)))


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
) -> None:
    """Compare B against A: config keys, then MTP tensors bit for bit (all with --all)."""

    def build() -> Report:
        from mtpcheck.checks.diff_checks import diff_report
        from mtpcheck.formats import open_checkpoint

        return diff_report(open_checkpoint(a), open_checkpoint(b), all_tensors=all_tensors)

    raise SystemExit(execute("diff", build, _opts(fmt, junit_xml, markdown, debug)))


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
