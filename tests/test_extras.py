"""The core install audits; each command that needs an extra says which one, before any work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mtpcheck.extras import EXTRAS, for_missing_module
from tests.conftest import FIXTURES
from tests.without_extras import HEAVY, run_core, stderr_lines

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
DISTRIBUTIONS = {"megatron": "megatron-core"}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_core_dependencies_bring_no_extra_package() -> None:
    core = _names(PROJECT["dependencies"])
    assert not core & {DISTRIBUTIONS.get(h, h) for h in HEAVY}, core


@pytest.mark.parametrize("extra", sorted(EXTRAS))
def test_each_extra_brings_the_modules_mtpcheck_names_for_it(extra: str) -> None:
    listed = _names(PROJECT["optional-dependencies"][extra])
    for module in EXTRAS[extra].modules:
        top = module.split(".")[0]
        assert DISTRIBUTIONS.get(top, top) in listed, (extra, module, listed)


def test_the_test_extra_installs_every_extra_but_vllm() -> None:
    test = PROJECT["optional-dependencies"]["test"]
    [own] = [r for r in test if r.startswith("mtpcheck[")]
    extras = set(own.removeprefix("mtpcheck[").removesuffix("]").split(","))
    # typecheck: tests/test_typed_api.py runs mypy; vllm pins clash, it has a venv of its own
    assert extras == {"convert", "accept", "plot", "typecheck"}


def test_audits_run_without_the_extras(tmp_path: Path) -> None:
    for argv in (
        ("inspect", str(FIXTURES / "deepseek_v3")),
        ("inspect", str(FIXTURES / "glm4_moe"), "--format", "json"),
        ("diff", str(FIXTURES / "mimo"), str(FIXTURES / "mimo")),
    ):
        run = run_core(*argv)
        assert run.returncode == 0, run.stderr
        stderr_lines(run)


@pytest.mark.parametrize(
    ("argv", "needs", "extra"),
    [
        (("roundtrip", "{fixture}"), "roundtrip", "convert"),
        (("roundtrip", "{fixture}", "--synthetic"), "roundtrip", "convert"),
        (("convert", "hf-to-megatron", "{fixture}", "{out}"), "convert hf-to-megatron", "convert"),
        (
            ("convert", "megatron-to-hf", "{fixture}", "{out}", "--hf-config", "{fixture}"),
            "convert megatron-to-hf",
            "convert",
        ),
        (("accept", "{accept}", "--workload", "w={readme}"), "accept on a checkpoint", "accept"),
    ],
)
def test_a_command_without_its_extra_names_it_in_one_line(
    tmp_path: Path, argv: tuple[str, ...], needs: str, extra: str
) -> None:
    fill = {
        "fixture": str(FIXTURES / "deepseek_v3"),
        "accept": str(FIXTURES / "accept_deepseek_v3"),
        "out": str(tmp_path / "out"),
        "readme": str(ROOT / "README.md"),
    }
    run = run_core(*(a.format(**fill) for a in argv))
    assert run.returncode == 2
    absent = ", ".join({"megatron.core": "megatron-core"}.get(m, m) for m in EXTRAS[extra].modules)
    assert stderr_lines(run) == [
        f"mtpcheck: error: {needs} needs {absent}, which the installed mtpcheck lacks: "
        f"pip install 'mtpcheck[{extra}]'"
    ]
    assert run.stdout == "" and not (tmp_path / "out").exists()


def test_the_plot_extra_is_named_when_only_it_is_missing(tmp_path: Path) -> None:
    """With torch and transformers present, ``--plot`` alone needs matplotlib."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class _NoPlot:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'matplotlib':\n"
        "            raise ModuleNotFoundError(name, name=name)\n"
        "sys.meta_path.insert(0, _NoPlot())\n"
        "from mtpcheck.cli import main\n"
        f"sys.exit(main(['accept', {str(FIXTURES / 'accept_deepseek_v3')!r}, '--workload',\n"
        f"    'w={ROOT / 'README.md'}', '--plot', {str(tmp_path / 'p.png')!r}]))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    assert run.stderr == (
        "mtpcheck: error: accept --plot needs matplotlib, which the installed mtpcheck lacks: "
        "pip install 'mtpcheck[plot]'\n"
    )
    assert not (tmp_path / "p.png").exists()


def test_json_output_of_a_missing_extra_is_an_error_report() -> None:
    """The check runs before the work, so the JSON error report is not written; stdout stays
    empty and stderr has the line (exit 2), as for any usage error."""
    run = run_core("roundtrip", str(FIXTURES / "deepseek_v3"), "--format", "json")
    assert run.returncode == 2 and run.stdout == ""
    assert "pip install 'mtpcheck[convert]'" in stderr_lines(run)[0]


@pytest.mark.parametrize(
    ("module", "command", "extra"),
    [
        ("torch", "roundtrip", "convert"),
        ("torch.nn.functional", "accept", "accept"),
        ("megatron.core.transformer", "convert", "convert"),
        ("matplotlib.pyplot", "accept", "plot"),
        ("transformers", "inspect", "convert"),
    ],
)
def test_an_unforeseen_missing_import_still_names_an_extra(
    module: str, command: str, extra: str
) -> None:
    error = for_missing_module(module, command)
    assert error is not None and str(error).endswith(f"pip install 'mtpcheck[{extra}]'")


def test_a_missing_module_no_extra_brings_is_not_blamed_on_one() -> None:
    assert for_missing_module("yaml", "inspect") is None
