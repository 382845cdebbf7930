"""Every exit code and output format of the command line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from mtpcheck import CheckName
from mtpcheck.report.json_ import SCHEMA_VERSION
from tests.conftest import FAMILY_FIXTURES, FIXTURES

INSPECT_CHECKS = [
    CheckName.INTEGRITY,
    CheckName.FAMILY,
    CheckName.MAIN_MODEL,
    CheckName.MTP_COUNT,
    CheckName.MTP_LAYERS,
    CheckName.MTP_SHAPES,
    CheckName.SHARED_COPIES,
    CheckName.MTP_TRAINED,
    CheckName.SERVING,
]
"""``inspect``'s checks, in report order."""


@pytest.mark.parametrize("name", FAMILY_FIXTURES)
def test_every_fixture_inspects_clean(run_cli, name: str) -> None:
    run = run_cli("inspect", FIXTURES / name)
    assert run.exit_code == 0, run
    assert "verdict: PASS" in run.stdout


def test_json_schema(run_cli) -> None:
    run = run_cli("inspect", FIXTURES / "deepseek_v3", "--format", "json")
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    assert report["schema_version"] == SCHEMA_VERSION
    assert (report["command"], report["ok"]) == ("inspect", True)
    assert report["tool"]["name"] == "mtpcheck"
    (inp,) = report["inputs"]
    assert inp["family"] == "deepseek_v3" and inp["declared_mtp_layers"] == 1
    (layer,) = inp["mtp_layers"]
    assert (
        layer["complete"] and layer["prefix"] == "model.layers.2." and len(layer["tensors"]) == 32
    )
    assert [c["name"] for c in report["checks"]] == INSPECT_CHECKS
    for check in report["checks"]:
        assert check["status"] in {"pass", "fail", "warn", "skip", "info"}
        assert all({"subject", "status", "message", "details"} <= set(f) for f in check["findings"])


def test_diff_json_lists_every_tensor_in_scope(run_cli) -> None:
    run = run_cli("diff", FIXTURES / "glm4_moe", FIXTURES / "glm4_moe", "--format", "json")
    report = json.loads(run.stdout)
    assert run.exit_code == 0 and report["ok"]
    names = {t["name"] for t in report["tensors"]}
    assert len(names) == 36  # 34 MTP tensors + main embedding + head
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= names
    assert all(t["status"] == "equal" for t in report["tensors"])
    full = json.loads(
        run_cli(
            "diff", FIXTURES / "glm4_moe", FIXTURES / "glm4_moe", "--all", "--format", "json"
        ).stdout
    )
    assert len(full["tensors"]) == 79


def test_junit_and_markdown_files(run_cli, fixture_copy, tmp_path: Path) -> None:
    damaged = fixture_copy("glm_moe_dsa")
    config = json.loads((damaged / "config.json").read_text())
    config["num_nextn_predict_layers"] = 0
    (damaged / "config.json").write_text(json.dumps(config))
    junit, md = tmp_path / "r.xml", tmp_path / "r.md"
    run = run_cli("inspect", damaged, "--junit-xml", junit, "--markdown", md)
    assert run.exit_code == 1, run
    suite = ET.parse(junit).getroot()
    assert suite.tag == "testsuite" and suite.get("failures") == "1"
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == INSPECT_CHECKS
    failure = cases[CheckName.MTP_COUNT].find("failure")
    assert failure is not None and "config declares 0" in failure.get("message", "")
    assert cases[CheckName.SHARED_COPIES].find("skipped") is not None
    text = md.read_text()
    assert text.startswith("## mtpcheck inspect: ❌ FAIL")
    assert "| ❌ | mtp-count | `mtp-count` | 1 MTP layer(s) present but config declares 0" in text


def test_input_error_json_and_debug(run_cli, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    run = run_cli("inspect", missing, "--format", "json")
    assert run.exit_code == 2
    assert json.loads(run.stdout)["error"] == {
        "path": str(missing),
        "reason": "no such file or directory",
    }
    assert run.stderr == f"mtpcheck: error: {missing}: no such file or directory\n"
    debug = run_cli("inspect", missing, "--debug")
    assert debug.exit_code == 2 and "Traceback" in debug.stderr


def test_usage_error_exits_2(run_cli) -> None:
    assert run_cli("inspect").exit_code == 2
    assert run_cli("diff", FIXTURES / "mimo", "--format", "yaml").exit_code == 2


def test_internal_error_exits_3(run_cli, monkeypatch) -> None:
    import mtpcheck.checks.inspect_checks as checks

    def boom(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(checks, "inspect_report", boom)
    run = run_cli("inspect", FIXTURES / "mimo")
    assert run.exit_code == 3
    assert run.stderr == (
        "mtpcheck: internal error: RuntimeError: boom (rerun with --debug for a traceback)\n"
    )


def test_interrupt_exits_130(run_cli, monkeypatch) -> None:
    import mtpcheck.checks.inspect_checks as checks

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(checks, "inspect_report", interrupted)
    run = run_cli("inspect", FIXTURES / "mimo")
    assert run.exit_code == 130 and run.stderr == "mtpcheck: interrupted\n"


def test_python_dash_m_and_console_script_agree() -> None:
    args = ["inspect", str(FIXTURES / "mimo"), "--format", "json"]
    via_module = subprocess.run(
        [sys.executable, "-m", "mtpcheck", *args], capture_output=True, text=True
    )
    assert via_module.returncode == 0, via_module.stderr
    assert json.loads(via_module.stdout)["ok"] is True
    bad = subprocess.run(
        [sys.executable, "-m", "mtpcheck", "diff", str(FIXTURES / "mimo"), "/nonexistent"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert bad.stderr == "mtpcheck: error: /nonexistent: no such file or directory\n"


HEAVY = ("torch", "transformers", "megatron", "safetensors", "numpy")


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", str(FIXTURES / "deepseek_v3")],
        ["diff", str(FIXTURES / "deepseek_v3"), str(FIXTURES / "deepseek_v3"), "--all"],
    ],
)
def test_inspect_and_safetensors_diff_import_no_heavy_modules(args: list[str]) -> None:
    code = (
        "import sys\n"
        "from mtpcheck.cli import main\n"
        f"rc = main({args!r})\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(rc, heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []"


def test_inspect_of_safetensors_imports_only_what_it_uses() -> None:
    """No pickle or Hub reader for a local safetensors checkpoint, and no rich for JSON."""
    args = ["inspect", str(FIXTURES / "deepseek_v3"), "--format", "json"]
    code = (
        "import sys\n"
        "from mtpcheck.cli import main\n"
        f"rc = main({args!r})\n"
        "print(rc, sorted(m for m in sys.modules if m.split('.')[0] == 'rich' or m in (\n"
        "    'mtpcheck.formats.safe_pickle', 'mtpcheck.formats.torch_save_record',\n"
        "    'mtpcheck.formats.hub', 'mtpcheck.report.table', 'zipfile', 'pickle')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "0 []"


@pytest.mark.parametrize("fmt", ["json", "table"])
@pytest.mark.parametrize(("fixture", "code"), [("mimo", 0), ("count_too_high", 1)])
def test_a_reader_that_leaves_early_gets_no_traceback(
    tmp_path: Path, fixture: str, code: int, fmt: str
) -> None:
    """``mtpcheck inspect ... | head``: the pipe closes before the report is written; the exit
    code is the verdict's (rich's own handling of a closed pipe would exit 1)."""
    target = FIXTURES / "mimo"
    if fixture == "count_too_high":  # a checkpoint with findings keeps its exit code
        target = tmp_path / "mimo"
        target.mkdir()
        for f in (FIXTURES / "mimo").iterdir():
            (target / f.name).write_bytes(f.read_bytes())
        config = json.loads((target / "config.json").read_text())
        config["num_nextn_predict_layers"] = 2
        (target / "config.json").write_text(json.dumps(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "mtpcheck", "inspect", str(target), "--format", fmt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the interpreter has even started: every write fails
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == code
    assert stderr == ""


def test_stderr_carries_only_mtpcheck_lines_unless_debug(tmp_path: Path) -> None:
    """megatron-core warns that Transformer Engine and Apex are missing when its model code is
    imported; that is library noise, shown with ``--debug`` only. (The torch_dist writer no
    longer imports that code, so the conversion here imports it first, inside the command.)"""
    code = (
        "import sys\n"
        "import mtpcheck.convert.builtin as builtin\n"
        "convert = builtin.hf_to_megatron\n"
        "def with_all_of_megatron(*args, **kwargs):\n"
        "    import megatron.core.tensor_parallel  # noqa: F401  (warns on import)\n"
        "    return convert(*args, **kwargs)\n"
        "builtin.hf_to_megatron = with_all_of_megatron\n"
        "from mtpcheck.cli import main\n"
        "raise SystemExit(main(sys.argv[1:]))\n"
    )

    def convert(*extra: str) -> subprocess.CompletedProcess[str]:
        dst = tmp_path / f"out{len(extra)}"
        args = ["convert", "hf-to-megatron", str(FIXTURES / "mimo"), str(dst), *extra]
        return subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
        )

    quiet = convert()
    assert quiet.returncode == 0, quiet.stderr
    assert all(line.startswith("mtpcheck: ") for line in quiet.stderr.splitlines()), quiet.stderr
    loud = convert("--debug")
    assert loud.returncode == 0, loud.stderr
    assert "Transformer Engine and Apex are not installed" in loud.stderr


def _mtpcheck(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mtpcheck", *map(str, args)], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("option", "value", "reason"),
    [
        ("--junit-xml", "/no/such/dir/j.xml", "/no/such/dir does not exist"),
        ("--markdown", "", "empty path (is the variable it came from unset?)"),
        ("'--markdown'", "/tmp", "File '/tmp' is a directory."),  # click's own check
    ],
)
def test_report_paths_are_checked_before_any_work(option: str, value: str, reason: str) -> None:
    run = _mtpcheck("roundtrip", FIXTURES / "mimo", option.strip("'"), value)
    assert run.returncode == 2
    assert run.stdout == ""
    # one line, and no stage ran ("mtpcheck: stage 1 ..." would come first)
    assert run.stderr == f"mtpcheck: error: Invalid value for {option}: {reason}\n"


def test_accept_plot_path_is_checked_before_any_work() -> None:
    run = _mtpcheck(
        "accept",
        FIXTURES / "accept_deepseek_v3",
        "--workload",
        f"w={FIXTURES / 'accept_deepseek_v3' / 'workloads' / 'in_domain.jsonl'}",
        "--plot",
        "/no/such/dir/x.png",
    )
    assert run.returncode == 2
    assert run.stderr == "mtpcheck: error: Invalid value for --plot: /no/such/dir does not exist\n"


def test_usage_errors_are_one_line() -> None:
    run = _mtpcheck("inspect")
    assert run.returncode == 2
    assert run.stderr == "mtpcheck: error: Missing argument 'PATH'.\n"


def test_a_report_file_that_cannot_be_written_keeps_the_report(
    run_cli, monkeypatch, tmp_path: Path
) -> None:
    """The path was fine when checked and went away during the work: the report still
    reaches stdout and the exit code says the file was not written."""
    from mtpcheck.cli import app

    target = tmp_path / "gone" / "j.xml"
    monkeypatch.setattr(app, "check_output_path", lambda option, path: None)
    run = run_cli("inspect", FIXTURES / "mimo", "--format", "json", "--junit-xml", target)
    assert run.exit_code == 2
    assert json.loads(run.stdout)["ok"] is True
    assert run.stderr == (
        f"mtpcheck: error: {target}: cannot write the report file (No such file or directory)\n"
    )


@pytest.mark.parametrize("columns", ["80", "200", "junk"])
def test_tensor_names_are_never_split_in_a_log(columns: str) -> None:
    """stdout is a pipe (a CI log): every name must be greppable on one line."""
    args = ["diff", FIXTURES / "glm4_moe", FIXTURES / "deepseek_v3", "--all"]
    env = {**os.environ, "COLUMNS": columns}
    table = subprocess.run(
        [sys.executable, "-m", "mtpcheck", *map(str, args)], capture_output=True, text=True, env=env
    )
    report = json.loads(_mtpcheck(*args, "--format", "json").stdout)
    (tensors,) = [c for c in report["checks"] if c["name"] == CheckName.TENSORS]
    names = [f["subject"] for f in tensors["findings"]][:25]  # what the table shows
    assert any(len(n) > 45 for n in names)
    lines = table.stdout.splitlines()
    for name in names:
        assert any(name in line for line in lines), name
    if columns == "200":
        assert max(len(line.rstrip()) for line in lines) <= 200


def test_roundtrip_of_a_megatron_checkpoint_is_usage_not_a_finding() -> None:
    megatron = Path(__file__).parent / "data" / "megatron_lm_0192"
    run = _mtpcheck("roundtrip", megatron)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (
        f"mtpcheck: error: {megatron}: is a megatron-torch-dist checkpoint; the round trip and "
        "hf-to-megatron start from an HF safetensors checkpoint (compare a Megatron checkpoint "
        "with its HF source with `mtpcheck diff HF MEGATRON`)\n"
    )


MAPPED = (
    "families with a mapping: DeepSeek-V3 / R1 / V3.1, DeepSeek-V3.2, Kimi-K2, GLM-4.5 / 4.6 / "
    "4.7, GLM-4.7-Flash, GLM-5, Hunyuan HY-V3, Qwen3-Next, Qwen3.5 / 3.6 (VLM), Qwen3.5 / 3.6 "
    "(text-only), K-EXAONE (EXAONE MoE), Nemotron-H / Nemotron 3, MiMo-7B"
)


def test_roundtrip_of_a_family_without_a_mapping_runs_no_converter(tmp_path: Path) -> None:
    src = FIXTURES / "step3p7"  # passes its audit; no Megatron mapping
    said = (
        f"mtpcheck: error: {src}: no HF <-> Megatron mapping for Step-3.7 yet: roundtrip cannot "
        "judge the Megatron checkpoint between its stages, so no converter was run; `mtpcheck "
        f"diff {src} FINAL_HF` compares the two HF ends ({MAPPED})\n"
    )
    run = _mtpcheck("roundtrip", src, "--workdir", tmp_path / "w")
    assert (run.returncode, run.stderr) == (2, said)
    assert list((tmp_path / "w").iterdir()) == []
    # with converters of the user's own: refused before the first one runs
    marker = tmp_path / "stage1-ran"
    run = _mtpcheck("roundtrip", src, "--workdir", tmp_path / "w",
                    "--to-megatron", f"touch {marker} && cp -r {{src}} {{dst}}",
                    "--to-hf", "cp -r {src} {dst}", "--format", "json")  # fmt: skip
    assert run.returncode == 2 and not marker.exists()
    error = json.loads(run.stdout)["error"]
    assert error["path"] == str(src) and said.split(f"{src}: ", 1)[1].startswith(error["reason"])
    converted = _mtpcheck("convert", "hf-to-megatron", src, tmp_path / "out")
    assert converted.returncode == 2
    assert converted.stderr == (
        f"mtpcheck: error: {src}: no HF <-> Megatron mapping for Step-3.7 yet: mtpcheck can "
        f"neither write its Megatron checkpoint nor judge one ({MAPPED})\n"
    )
    assert not (tmp_path / "out").exists()


def test_diff_of_a_megatron_checkpoint_with_an_unmapped_hf_family_names_it(tmp_path) -> None:
    src, megatron = FIXTURES / "step3p7", Path(__file__).parent / "data" / "megatron_lm_0192"
    run = _mtpcheck("diff", src, megatron, "--format", "json")
    assert run.returncode == 2
    assert json.loads(run.stdout)["error"] == {
        "path": str(src),
        "reason": "no HF <-> Megatron mapping for Step-3.7 yet: it cannot be "
        f"compared with the Megatron checkpoint {megatron}; diff it with an HF checkpoint "
        f"instead ({MAPPED})",
    }


def test_convert_refuses_a_full_destination_before_importing_megatron(tmp_path: Path) -> None:
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep").write_text("x")
    code = (
        "import sys\n"
        "from mtpcheck.cli import main\n"
        f"rc = main(['convert', 'hf-to-megatron', {str(FIXTURES / 'mimo')!r}, {str(dst)!r}])\n"
        "print(rc, any(m.startswith('megatron') for m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["2", "False"]
    assert done.stderr == (
        f"mtpcheck: error: {dst}: destination exists and is not empty; refusing to overwrite\n"
    )
    assert (dst / "keep").read_text() == "x"


def test_convert_says_what_it_wrote(tmp_path: Path) -> None:
    run = _mtpcheck("convert", "hf-to-megatron", FIXTURES / "mimo", tmp_path / "m")
    assert run.returncode == 0, run.stderr
    assert re.fullmatch(
        rf"mtpcheck: wrote {tmp_path / 'm' / 'release'} \(43 tensors, 19\.00 KiB\) in [0-9.]+ s\n",
        run.stderr,
    ), run.stderr


def test_the_version_has_one_place(run_cli) -> None:
    import importlib.metadata

    import mtpcheck

    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]$', pyproject, re.M)
    assert not re.search(r"^version = \"", pyproject, re.M)  # no literal version
    run = run_cli("--version")
    assert run.exit_code == 0, run
    assert run.stdout == f"mtpcheck, version {mtpcheck.__version__}\n"
    assert importlib.metadata.version("mtpcheck") == mtpcheck.__version__


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (KeyboardInterrupt(), 130, "mtpcheck: interrupted"),
        ("abort", 130, "mtpcheck: interrupted"),
        ("usage", 2, "mtpcheck: error: no such option"),
        ("path", 2, "mtpcheck: error: ckpt: unreadable"),
        ("damaged", 1, "mtpcheck: refused: ckpt: shard missing"),
        (ModuleNotFoundError("No module named 'nosuch'", name="nosuch"), 3,
         "mtpcheck: internal error: ModuleNotFoundError: No module named 'nosuch'"),
        (RuntimeError("boom"), 3,
         "mtpcheck: internal error: RuntimeError: boom (rerun with --debug for a traceback)"),
    ],
)  # fmt: skip
def test_one_mapping_from_exceptions_to_exit_codes(
    error: BaseException | str, code: int, line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import click

    from mtpcheck.cli.app import exit_code
    from mtpcheck.errors import DamagedInput, InputError

    made = {
        "abort": click.exceptions.Abort(),
        "usage": click.UsageError("no such option"),
        "path": InputError("ckpt", "unreadable"),
        "damaged": DamagedInput("ckpt", "shard missing"),
    }
    raised = made[error] if isinstance(error, str) else error
    assert exit_code(raised, "inspect", hint=True) == code
    assert capsys.readouterr().err == line + "\n"


def test_a_missing_extra_is_named_by_the_mapping(capsys: pytest.CaptureFixture[str]) -> None:
    from mtpcheck.cli.app import exit_code

    error = ModuleNotFoundError("No module named 'torch'", name="torch")
    assert exit_code(error, "roundtrip") == 2
    assert "mtpcheck[convert]" in capsys.readouterr().err


def test_strict_fails_a_run_that_only_warned(run_cli, tmp_path: Path) -> None:
    """Megatron-Bridge writes the Qwen3.5-MoE fixture's tensors widened to F32: every value
    kept, a warning; under --strict the run fails on it, in every report."""
    megatron = Path(__file__).parent / "data" / "megatron_bridge_062" / "qwen3_5_moe" / "megatron"
    plain = run_cli("diff", FIXTURES / "qwen3_5_moe", megatron, "--quiet")
    assert plain.exit_code == 0 and plain.stdout.rstrip().endswith("verdict: PASS"), plain
    junit = tmp_path / "junit.xml"
    strict = run_cli(
        "diff", FIXTURES / "qwen3_5_moe", megatron, "--quiet", "--strict", "--junit-xml", junit
    )
    assert strict.exit_code == 1, strict
    assert strict.stdout.rstrip().endswith("verdict: FAIL (tensors) under --strict")
    assert junit.read_text().count("<failure") == 1
    report = json.loads(
        run_cli(
            "diff", FIXTURES / "qwen3_5_moe", megatron, "-q", "--strict", "--format", "json"
        ).stdout
    )
    assert report["ok"] is False
