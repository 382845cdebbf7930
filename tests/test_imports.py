"""Each command imports what it runs: ``--help``, ``inspect`` and ``diff`` import nothing of
``accept``'s measurement, the server client, the converters or the renderers they do not use.

Each command runs in a fresh interpreter, through the console script's own entry point, and
the modules it imported are read from ``sys.modules`` after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DS = ROOT / "fixtures" / "deepseek_v3"
QN = ROOT / "fixtures" / "qwen3_next"

PROBE = """
import contextlib, io, json, sys
from mtpcheck.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""

DATA_TABLES = {"mtpcheck.accept", "mtpcheck.accept.options", "mtpcheck.accept.server_engines",
               "mtpcheck.accept.server_answers"}  # fmt: skip
"""What of ``accept`` the CLI may import to declare its options: the options themselves and
the engines' names and metric tables."""
CONVERTERS = ("mtpcheck.convert", "mtpcheck.pipeline.converter_command",
              "mtpcheck.pipeline.roundtrip", "mtpcheck.pipeline.gated_convert",
              "mtpcheck.pipeline.drafter_roundtrip", "mtpcheck.pipeline.distributed")  # fmt: skip
HEAVY = ("torch", "transformers", "matplotlib", "megatron", "safetensors")
ACCEPT_SECTIONS = tuple(
    f"mtpcheck.report.sections.{name}"
    for name in ("offline", "chain", "online", "engine", "server")
)


def _imported(*args: str | Path) -> tuple[int, set[str]]:
    """The exit code of ``mtpcheck ARGS`` and every module it imported."""
    run = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    answer = json.loads(run.stdout.splitlines()[-1])
    return answer["code"], set(answer["modules"])


def _within(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


def _audit_path_is_clean(modules: set[str]) -> None:
    accept = {m for m in modules if m.startswith("mtpcheck.accept")}
    assert accept <= DATA_TABLES, sorted(accept - DATA_TABLES)
    assert _within(modules, CONVERTERS) == []
    assert _within(modules, HEAVY) == []
    assert _within(modules, ACCEPT_SECTIONS) == []


def test_help_imports_no_command_s_work() -> None:
    code, modules = _imported("--help")
    assert code == 0
    _audit_path_is_clean(modules)
    # nor the readers, the checks or any renderer: --help only lists the commands
    assert _within(modules, ("mtpcheck.formats", "numpy", "rich", "msgspec")) == []
    checks = {m for m in modules if m.startswith("mtpcheck.checks.")}
    assert checks == {"mtpcheck.checks.options"}
    assert _within(modules, ("mtpcheck.report.table", "mtpcheck.report.json_")) == []


@pytest.mark.parametrize(
    ("args", "renderer", "unused"),
    [
        (("inspect", DS), "mtpcheck.report.table", ("json_", "junit", "markdown")),
        (("inspect", DS, "--format", "json"), "mtpcheck.report.json_", ("table", "junit", "rich")),
        (("diff", DS, QN), "mtpcheck.report.table", ("json_", "junit", "markdown")),
    ],
)
def test_the_audit_imports_only_what_it_runs(
    args: tuple[str | Path, ...], renderer: str, unused: tuple[str, ...]
) -> None:
    code, modules = _imported(*args, "-q")
    assert code in (0, 1)
    assert renderer in modules  # the probe saw the command run
    _audit_path_is_clean(modules)
    names = tuple(n if n == "rich" else f"mtpcheck.report.{n}" for n in unused)
    assert _within(modules, names) == []
    if args[0] == "inspect":  # one checkpoint: nothing of diff's two-sided checks
        assert "mtpcheck.checks.diff_checks" not in modules


def test_the_probe_sees_an_import_that_happens() -> None:
    """The probe is no stub: a renderer the command does run (``--markdown``) shows up."""
    _code, modules = _imported("inspect", DS, "--format", "json", "-q", "--markdown", "/dev/null")
    assert "mtpcheck.report.markdown" in modules
