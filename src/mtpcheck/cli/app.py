"""The click group, shared options and the one place outcomes become exit codes."""

from __future__ import annotations

import functools
import json
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn

import click

from mtpcheck import __version__, declared
from mtpcheck.cli.library_noise import silence_libraries, wants_debug
from mtpcheck.cli.stderr_log import StderrLog
from mtpcheck.errors import DamagedInput, ExitCode, MtpcheckError, PathError
from mtpcheck.extras import for_missing_module
from mtpcheck.model import Report
from mtpcheck.report import STDOUT_FORMATS

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]
"""A click option (or argument) decorator."""


def defaulted(*decls: str, kind: click.ParamType[Any], default: Any, **attrs: Any) -> Decorator:
    """An option whose default ``--help`` shows."""
    return click.option(*decls, type=kind, default=default, show_default=True, **attrs)


def file_option(name: str, help: str) -> Decorator:
    """An option naming a file (not a folder), e.g. a report written beside stdout's."""
    return click.option(name, type=click.Path(dir_okay=False, path_type=Path), help=help)


DEBUG = click.option("--debug", is_flag=True, help="Show tracebacks for errors.")


def apply(decorators: Sequence[Decorator]) -> Decorator:
    """One decorator applying ``decorators`` as if written one above the other, first on top
    (so a group of options keeps its order in ``--help``)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate


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
    strict: bool = False
    """A check that warns fails the run too (exit 1)."""

    @cached_property
    def log(self) -> StderrLog:
        """mtpcheck's own progress on stderr (a live bar on a terminal), unless ``--quiet``."""
        return StderrLog(self.quiet)

    def validate(self) -> None:
        """Warn about ``--trust-pickle`` and refuse report paths that cannot be written, before
        any work is done."""
        if self.trust_pickle:
            click.echo(
                "mtpcheck: warning: --trust-pickle: pickled files are loaded without the "
                "allowlist and can run code; use it only for files you vouch for",
                err=True,
            )
        check_output_path("--junit-xml", self.junit_xml)
        check_output_path("--markdown", self.markdown)


_OUTPUT_OPTIONS: list[Decorator] = [
    defaulted(
        "--format",
        "fmt",
        kind=click.Choice(STDOUT_FORMATS),
        default="table",
        help="Report format on stdout.",
    ),
    file_option("--junit-xml", "Also write a JUnit XML report (one testcase per check)."),
    file_option("--markdown", "Also write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY)."),
    DEBUG,
    click.option("--quiet", "-q", is_flag=True, help="No progress on stderr; errors only."),
    click.option(
        "--strict",
        is_flag=True,
        help="A check that warns fails the run too (exit 1): for gates that require "
        "bit-identity where a value-exact widening is a warning.",
    ),
    click.option(
        "--trust-pickle",
        is_flag=True,
        help="Unpickle Megatron .pt/.metadata files without the allowlist. "
        "Only for files you vouch for: a pickle can run code.",
    ),
]


def output_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options shared by every command that produces a report, handed to ``func`` as one
    :class:`OutputOptions` parameter, ``opts``."""

    @functools.wraps(func)
    def with_output(
        *args: Any,
        fmt: str,
        junit_xml: Path | None,
        markdown: Path | None,
        debug: bool,
        trust_pickle: bool,
        quiet: bool,
        strict: bool,
        **kwargs: Any,
    ) -> Any:
        opts = OutputOptions(fmt, junit_xml, markdown, debug, trust_pickle, quiet, strict)
        return func(*args, opts=opts, **kwargs)

    return apply(_OUTPUT_OPTIONS)(with_output)


def check_output_path(option: str, path: Path | None) -> None:
    """Refuse a report path that cannot be written, before any work is done (the rule every
    output file is held to, :func:`mtpcheck.declared.check_output_path`), as click's usage
    error."""
    try:
        declared.check_output_path(option, path)
    except declared.UsageError as e:
        raise click.UsageError(str(e)) from e


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
    """Run ``build``, print its report and map the outcome to the documented exit codes."""
    try:
        report = replace(build(), strict=opts.strict)
        try:
            unwritten = _emit(report, opts)
        except BrokenPipeError:  # `mtpcheck ... | head`: the reader left; the verdict stands
            _stdout_gone()
            unwritten = None
        if unwritten is not None:
            click.echo(f"mtpcheck: error: {unwritten}", err=True)
            return ExitCode.BAD_INPUT
    except (Exception, KeyboardInterrupt) as e:
        if isinstance(e, MtpcheckError) and opts.format == "json":
            from mtpcheck.report.json_ import error_dict

            path = e.path if isinstance(e, PathError) else ""
            reason = e.reason if isinstance(e, PathError) else str(e)
            print(json.dumps(error_dict(command, path, reason), indent=2))
        return exit_code(e, command, opts.debug, hint=True)
    return ExitCode.OK if report.ok else ExitCode.FINDINGS


RankRun = Callable[[Callable[[Callable[[], Report]], int]], int]
"""One rank of a torchrun job: called with rank 0's way to report a built :class:`Report`, it
returns the rank's exit code."""


def _across_ranks(command: str, opts: OutputOptions, run: RankRun) -> int:
    """``run`` one rank of a torchrun job with rank 0's ``execute``; its common exit code."""

    def on_rank0(build: Callable[[], Report]) -> int:
        return execute(command, build, opts)

    try:
        return run(on_rank0)
    except Exception as e:  # the process group itself failed (rendezvous, timeout)
        click.echo(f"mtpcheck: error: torch.distributed: {type(e).__name__}: {e}", err=True)
        return ExitCode.INTERNAL


def report_and_exit(
    command: str,
    build: Callable[[], Report],
    opts: OutputOptions,
    ranked: Callable[[], RankRun] | None = None,
) -> NoReturn:
    """End a reporting command: check the output options, then run ``build`` (or, under
    torchrun, the rank's share that ``ranked`` returns) and exit with the code of its outcome."""
    opts.validate()
    if ranked is not None and under_torchrun():
        exit_rank(_across_ranks(command, opts, ranked()))
    raise SystemExit(execute(command, build, opts))


def _stdout_gone() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


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


def exit_code(e: BaseException, command: str, debug: bool = False, hint: bool = False) -> int:
    """The one mapping of an exception to a line on stderr and a documented exit code.

    An interruption is 130; an :class:`MtpcheckError`, or an import an extra brings, is the
    user's input (2, or 1 for a refused checkpoint); a click usage error is 2; anything else is
    a bug of ours (3, its traceback behind ``--debug``; ``hint`` says so).
    """
    if isinstance(e, (KeyboardInterrupt, click.exceptions.Abort)):
        click.echo("mtpcheck: interrupted", err=True)
        return ExitCode.INTERRUPTED
    if isinstance(e, click.ClickException):  # one line, as every other error
        click.echo(f"mtpcheck: error: {e.format_message()}", err=True)
        return ExitCode.BAD_INPUT
    if debug:
        traceback.print_exception(e)
    if isinstance(e, ModuleNotFoundError):
        missing = for_missing_module(e.name or "", command)
        if missing is not None:
            return _error_line(missing)
        hint = False
    if isinstance(e, MtpcheckError):
        return _error_line(e)
    suffix = " (rerun with --debug for a traceback)" if hint else ""
    click.echo(f"mtpcheck: internal error: {type(e).__name__}: {e}{suffix}", err=True)
    return ExitCode.INTERNAL


def run_action(action: Callable[[], None], debug: bool, command: str) -> NoReturn:
    """End a command that writes instead of reporting: run ``action``, exit with its code."""
    try:
        action()
    except (Exception, KeyboardInterrupt) as e:
        raise SystemExit(exit_code(e, command, debug)) from None
    raise SystemExit(ExitCode.OK)


def exit_rank(code: int) -> NoReturn:
    """End a torchrun rank once its work is done, flushed and its process group destroyed,
    without the interpreter's teardown: there libtorch's gloo and store threads can hit
    ``std::terminate`` in static destructors on a loaded machine (SIGABRT, "terminate called
    without an active exception"), turning a finished run into a failed rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(code))


def under_torchrun() -> bool:
    """``WORLD_SIZE`` > 1: started by torchrun (see benchmarks/README.md, cluster scale)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not wants_debug(args):
        silence_libraries()
    try:
        cli.main(args=argv, prog_name="mtpcheck", standalone_mode=False)
    except SystemExit as e:
        return int(e.code or 0)
    except (
        click.exceptions.Abort,
        click.ClickException,  # `--help` shows the usage
        MtpcheckError,  # raised while the options are checked (a missing extra)
        ModuleNotFoundError,  # an import that no command's own check foresaw
    ) as e:
        return exit_code(e, next((a for a in args if not a.startswith("-")), ""))
    return ExitCode.OK
