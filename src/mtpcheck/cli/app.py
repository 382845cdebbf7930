"""The click group, shared options and the one place outcomes become exit codes."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import click

from mtpcheck import __version__
from mtpcheck.cli.library_noise import silence_libraries, wants_debug
from mtpcheck.cli.stderr_log import StderrLog
from mtpcheck.errors import DamagedInput, ExitCode, MtpcheckError, PathError
from mtpcheck.extras import for_missing_module
from mtpcheck.layouts import MegatronLayout
from mtpcheck.model import Report

FORMATS = ("table", "json")

MEGATRON_LAYOUT = click.option(
    "--megatron-layout",
    type=click.Choice([layout.value for layout in MegatronLayout]),
    default=MegatronLayout.MEGATRON_CORE.value,
    show_default=True,
    callback=lambda _ctx, _param, value: MegatronLayout(value),
    help="Whose modules the Megatron checkpoint is saved from: megatron-core's (Megatron-Bridge, "
    "Megatron-LM, mbridge, the built-in converter) or mcore-bridge's (ms-swift 4), which lay "
    "out the gated delta net and gated attention of Qwen3-Next / 3.5 their own way.",
)


@dataclass(frozen=True)
class OutputOptions:
    """Where and how a report is written."""

    format: str
    junit_xml: Path | None
    markdown: Path | None
    debug: bool
    trust_pickle: bool = False
    quiet: bool = False
    """No progress lines on stderr (errors still go there)."""

    @cached_property
    def log(self) -> StderrLog:
        """mtpcheck's own progress on stderr (a live bar on a terminal), unless ``--quiet``."""
        return StderrLog(self.quiet)


def output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by every command that produces a report."""
    decorators = [
        click.option(
            "--format",
            "fmt",
            type=click.Choice(FORMATS),
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
        click.option("--quiet", "-q", is_flag=True, help="No progress on stderr; errors only."),
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


def check_output_path(option: str, path: Path | None) -> None:
    """Refuse a report path that cannot be written, before any work is done."""
    if path is None:
        return
    if str(path) in ("", "."):
        raise click.BadParameter(
            "empty path (is the variable it came from unset?)", param_hint=option
        )
    if path.is_dir():
        raise click.BadParameter(f"{path} is a directory", param_hint=option)
    parent = path.parent
    if not parent.is_dir():
        raise click.BadParameter(f"{parent} does not exist", param_hint=option)
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise click.BadParameter(f"{path} is not writable", param_hint=option)


def _emit(report: Report, opts: OutputOptions) -> str | None:
    """Print the report, then write the report files; returns why a file could not be
    written (the report on stdout is never lost to it)."""
    from mtpcheck.report import renderer

    renderer(opts.format).render(report, sys.stdout)
    sys.stdout.flush()
    for kind, path in (("junit", opts.junit_xml), ("markdown", opts.markdown)):
        if path is not None:
            try:
                with open(path, "w", encoding="utf-8") as stream:
                    renderer(kind).render(report, stream)
            except OSError as e:
                return f"{path}: cannot write the report file ({e.strerror or e})"
    return None


def execute(command: str, build: Callable[[], Report], opts: OutputOptions) -> int:
    """Run ``build`` and map its outcome to the documented exit codes."""
    try:
        report = build()
        try:
            unwritten = _emit(report, opts)
        except BrokenPipeError:  # `mtpcheck ... | head`: the reader left; the verdict stands
            _stdout_gone()
            unwritten = None
        if unwritten is not None:
            click.echo(f"mtpcheck: error: {unwritten}", err=True)
            return ExitCode.BAD_INPUT
    except MtpcheckError as e:
        if opts.debug:
            traceback.print_exc()
        if opts.format == "json":
            from mtpcheck.report.json_ import error_dict

            path = e.path if isinstance(e, PathError) else ""
            reason = e.reason if isinstance(e, PathError) else str(e)
            print(json.dumps(error_dict(command, path, reason), indent=2))
        return _error_line(e)
    except KeyboardInterrupt:
        click.echo("mtpcheck: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except ModuleNotFoundError as e:
        return _missing_module(e, command, opts.debug)
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


def _stdout_gone() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def make_options(
    fmt: str,
    junit_xml: Path | None,
    markdown: Path | None,
    debug: bool,
    trust_pickle: bool,
    quiet: bool = False,
) -> OutputOptions:
    if trust_pickle:
        click.echo(
            "mtpcheck: warning: --trust-pickle: pickled files are loaded without the allowlist "
            "and can run code; use it only for files you vouch for",
            err=True,
        )
    check_output_path("--junit-xml", junit_xml)
    check_output_path("--markdown", markdown)
    return OutputOptions(fmt, junit_xml, markdown, debug, trust_pickle, quiet)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mtpcheck")
def cli() -> None:
    """Prove that a checkpoint's Multi-Token-Prediction (MTP) layers survive."""


def _error_line(e: MtpcheckError) -> int:
    """Say ``e`` in one line on stderr; its exit code: 1 for a checkpoint refused for its
    defects, 2 for input mtpcheck cannot handle."""
    if isinstance(e, DamagedInput):
        click.echo(f"mtpcheck: refused: {e}", err=True)
        return ExitCode.FINDINGS
    click.echo(f"mtpcheck: error: {e}", err=True)
    return ExitCode.BAD_INPUT


def _missing_module(e: ModuleNotFoundError, command: str, debug: bool) -> int:
    """An import that failed: the extra to install where one brings the module (exit 2),
    otherwise a bug of ours (exit 3)."""
    if debug:
        traceback.print_exc()
    missing = for_missing_module(e.name or "", command)
    if missing is not None:
        return _error_line(missing)
    click.echo(f"mtpcheck: internal error: {type(e).__name__}: {e}", err=True)
    return ExitCode.INTERNAL


def run_action(action: Callable[[], None], debug: bool, command: str) -> int:
    """Exit-code mapping for commands that write instead of report."""
    try:
        action()
    except MtpcheckError as e:
        if debug:
            traceback.print_exc()
        return _error_line(e)
    except KeyboardInterrupt:
        click.echo("mtpcheck: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except ModuleNotFoundError as e:
        return _missing_module(e, command, debug)
    except Exception as e:
        if debug:
            traceback.print_exc()
        click.echo(f"mtpcheck: internal error: {type(e).__name__}: {e}", err=True)
        return ExitCode.INTERNAL
    return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not wants_debug(args):
        silence_libraries()
    try:
        cli.main(args=argv, prog_name="mtpcheck", standalone_mode=False)
    except SystemExit as e:
        return int(e.code or 0)
    except click.exceptions.Abort:
        click.echo("mtpcheck: interrupted", err=True)
        return ExitCode.INTERRUPTED
    except MtpcheckError as e:  # raised while the options are checked (a missing extra)
        return _error_line(e)
    except ModuleNotFoundError as e:  # an import that no command's own check foresaw
        return _missing_module(e, next((a for a in args if not a.startswith("-")), ""), False)
    except click.ClickException as e:
        # one line, as every other error; `--help` shows the usage
        click.echo(f"mtpcheck: error: {e.format_message()}", err=True)
        return ExitCode.BAD_INPUT
    return ExitCode.OK
