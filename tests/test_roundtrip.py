"""``mtpcheck roundtrip``: bit-exact with the built-in converters; damage is named by stage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES, Run

DAMAGING = f"{sys.executable} {Path(__file__).parent / 'converters' / 'damaging.py'}"


KEPT = " (every value kept: the wider type holds each exactly)"


def _report(run: Run) -> dict[str, Any]:
    return json.loads(run.stdout)


def _failing(report: dict[str, Any], check: str) -> list[tuple[str, str]]:
    found = [c for c in report["checks"] if c["name"] == check]
    assert found, f"no check {check}: {[c['name'] for c in report['checks']]}"
    return [(f["subject"], f["message"]) for f in found[0]["findings"] if f["status"] == "fail"]


def _warning(report: dict[str, Any], check: str) -> list[tuple[str, str]]:
    (found,) = [c for c in report["checks"] if c["name"] == check]
    return [(f["subject"], f["message"]) for f in found["findings"] if f["status"] == "warn"]


def _statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


@pytest.mark.parametrize("family", ["glm4_moe", "mimo", "deepseek_v3"])
def test_builtin_round_trip_is_bit_exact(run_cli, tmp_path: Path, family: str) -> None:
    run = run_cli(
        "roundtrip", FIXTURES / family, "--all", "--workdir", tmp_path, "--format", "json"
    )
    assert run.exit_code == 0, run
    report = _report(run)
    assert _statuses(report) == {
        CheckName.SOURCE_INTEGRITY: "pass",
        CheckName.SOURCE_FAMILY: "pass",
        CheckName.SOURCE_MTP_COUNT: "pass",
        CheckName.SOURCE_MTP_LAYERS: "pass",
        CheckName.SOURCE_MTP_SHAPES: "pass",
        CheckName.SOURCE_SHARED_COPIES: "skip"
        if family == "mimo"
        else "pass",  # mimo stores no copies
        CheckName.SOURCE_MTP_TRAINED: "pass",
        CheckName.SOURCE_SERVING: {"deepseek_v3": "warn", "glm4_moe": "info", "mimo": "skip"}[
            family
        ],
        CheckName.SOURCE_MAIN_MODEL: "pass",
        CheckName.SOURCE_MCORE_MODEL: "pass",
        CheckName.STAGE1_CONVERT: "pass",
        CheckName.STAGE1_MTP_COUNT: "pass",
        CheckName.STAGE1_TENSORS: "pass",
        CheckName.STAGE2_CONVERT: "pass",
        CheckName.CONFIG: "pass",
        CheckName.ROUNDTRIP_TENSORS: "pass",
        CheckName.FINAL_MAIN_MODEL: "pass",
        CheckName.FINAL_MTP_COUNT: "pass",
    }
    assert {t["status"] for t in report["tensors"]} == {"equal"}
    heads = {c["name"]: c["findings"][0]["details"] for c in report["checks"]}
    assert (
        heads[CheckName.STAGE1_CONVERT]["seconds"] > 0
        and heads[CheckName.STAGE2_CONVERT]["seconds"] > 0
    )
    assert heads[CheckName.ROUNDTRIP_TENSORS]["bytes_compared"] == sum(
        t["nbytes"] for t in report["tensors"]
    )
    assert len(report["tensors"]) == len(report["inputs"][0]["mtp_layers"][0]["tensors"]) + (
        report["inputs"][0]["tensor_count"] - len(report["inputs"][0]["mtp_layers"][0]["tensors"])
    )
    assert list(tmp_path.iterdir()) == []  # temporary checkpoints removed


def test_converter_dropping_mtp_at_stage_1(run_cli, tmp_path: Path) -> None:
    run = run_cli(
        "roundtrip",
        FIXTURES / "glm4_moe",
        "--workdir",
        tmp_path,
        "--format",
        "json",
        "--to-megatron",
        f"{DAMAGING} drop-mtp-weights {{src}} {{dst}}",
    )
    assert run.exit_code == 1, run
    report = _report(run)
    stage1 = dict(_failing(report, CheckName.STAGE1_TENSORS))
    assert stage1["mtp.layers.0.eh_proj.weight"].startswith(
        "stage 1 (HF -> Megatron): missing in Megatron output (was BF16[16, 32]) "
        "[from model.layers.2.eh_proj.weight]"
    )
    final = dict(_failing(report, CheckName.ROUNDTRIP_TENSORS))
    assert final["model.layers.2.eh_proj.weight"] == (
        "stage 1 (HF -> Megatron) (as mtp.layers.0.eh_proj.weight): missing in final "
        "(was BF16[16, 32])"
    )
    assert len(final) == 34  # every MTP tensor of the GLM layer, the two copies included
    assert list(tmp_path.iterdir()) == []


def test_converter_forgetting_the_mimo_swap_at_stage_2(run_cli, tmp_path: Path) -> None:
    config = FIXTURES / "mimo" / "config.json"
    run = run_cli(
        "roundtrip",
        FIXTURES / "mimo",
        "--workdir",
        tmp_path,
        "--format",
        "json",
        "--to-hf",
        f"{DAMAGING} no-swap-back {{src}} {{dst}} {config}",
    )
    assert run.exit_code == 1, run
    report = _report(run)
    assert _statuses(report)[CheckName.STAGE1_TENSORS] == "pass"
    ((subject, message),) = _failing(report, CheckName.ROUNDTRIP_TENSORS)
    assert subject == "model.mtp_layers.0.input_proj.weight"
    assert message.startswith(
        "stage 2 (Megatron -> HF) (as mtp.layers.0.eh_proj.weight): bits differ in 512 of "
        "512 elements, first at index [0, 0]"
    )


def test_converter_changing_dtype_at_stage_1(run_cli, tmp_path: Path) -> None:
    run = run_cli(
        "roundtrip",
        FIXTURES / "deepseek_v3",
        "--workdir",
        tmp_path,
        "--format",
        "json",
        "--to-megatron",
        f"{DAMAGING} upcast-eh-proj {{src}} {{dst}}",
    )
    assert run.exit_code == 0, run  # every value kept: warned, not failed
    report = _report(run)
    assert _warning(report, CheckName.STAGE1_TENSORS) == [
        (
            "mtp.layers.0.eh_proj.weight",
            f"stage 1 (HF -> Megatron): dtype changed BF16 -> F32{KEPT} "
            "[from model.layers.2.eh_proj.weight]",
        )
    ]
    assert (
        _failing(report, CheckName.STAGE1_TENSORS)
        == _failing(report, CheckName.ROUNDTRIP_TENSORS)
        == []
    )
    assert _warning(report, CheckName.ROUNDTRIP_TENSORS) == [
        (
            "model.layers.2.eh_proj.weight",
            "stage 1 (HF -> Megatron) (as mtp.layers.0.eh_proj.weight): dtype changed BF16 -> "
            f"F32{KEPT}",
        )
    ]


def test_converter_dropping_the_count_key_at_stage_2(run_cli, tmp_path: Path) -> None:
    config = FIXTURES / "glm4_moe" / "config.json"
    run = run_cli(
        "roundtrip",
        FIXTURES / "glm4_moe",
        "--workdir",
        tmp_path,
        "--format",
        "json",
        "--to-hf",
        f"{DAMAGING} drop-count-key {{src}} {{dst}} {config}",
    )
    assert run.exit_code == 1, run
    report = _report(run)
    assert _failing(report, CheckName.CONFIG) == [("num_nextn_predict_layers", "1 -> (absent)")]
    assert _statuses(report)[CheckName.ROUNDTRIP_TENSORS] == "pass"


@pytest.mark.parametrize(
    ("mode", "extra", "message"),
    [
        (
            "fail",
            [],
            "converter exited with status 3; stderr tail:\nloading shards...\n"
            "KeyError: 'mtp.layers.0.eh_proj.weight'",
        ),
        ("hang", ["--timeout", "1.5"], "converter timed out after 1.5 s"),
        ("nothing", [], "converter exited 0 but wrote nothing to "),
    ],
)
def test_failing_converters_are_findings(run_cli, tmp_path: Path, mode, extra, message) -> None:
    run = run_cli(
        "roundtrip",
        FIXTURES / "mimo",
        "--workdir",
        tmp_path,
        "--format",
        "json",
        "--to-megatron",
        f"{DAMAGING} {mode} {{src}} {{dst}}",
        *extra,
    )
    assert run.exit_code == 1, run
    ((subject, text),) = _failing(_report(run), CheckName.STAGE1_CONVERT)
    assert subject == "stage 1 (HF -> Megatron)" and text.startswith(message)
    assert list(tmp_path.iterdir()) == []


def test_keep_keeps_and_says_where(run_cli, tmp_path: Path) -> None:
    run = run_cli("roundtrip", FIXTURES / "mimo", "--workdir", tmp_path, "--keep")
    assert run.exit_code == 0, run
    (kept,) = tmp_path.iterdir()
    assert f"kept the round trip's checkpoints in {kept}" in run.stderr
    assert sorted(p.name for p in kept.iterdir()) == ["hf", "megatron"]
    assert (kept / "megatron" / "release" / "metadata.json").exists()


def test_template_without_placeholders_is_a_usage_error(run_cli) -> None:
    run = run_cli("roundtrip", FIXTURES / "mimo", "--to-hf", "convert.sh")
    assert run.exit_code == 2
    assert "lacks {src} and {dst}" in run.stderr


def test_not_enough_disk_is_refused_before_starting(run_cli, tmp_path: Path, monkeypatch) -> None:
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(100, 99, 1))
    run = run_cli("roundtrip", FIXTURES / "mimo", "--workdir", tmp_path)
    assert run.exit_code == 2, run
    assert "not enough free disk for the round trip: needs about" in run.stderr
    assert list(tmp_path.iterdir()) == []


def test_synthetic_round_trip_from_a_config_only(run_cli, tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text((FIXTURES / "deepseek_v3" / "config.json").read_text())
    run = run_cli(
        "roundtrip", config, "--synthetic", "--workdir", tmp_path / "w", "--format", "json"
    )
    assert run.exit_code == 0, run
    source = _report(run)["inputs"][0]
    assert source["family"] == "deepseek_v3" and source["declared_mtp_layers"] == 1
    assert source["mtp_layers"][0]["complete"]
    # not the temporary folder, which is gone when the report is read
    assert source["path"] == f"synthetic checkpoint built from {config}"


def test_sigint_removes_temporary_checkpoints(tmp_path: Path) -> None:
    work = tmp_path / "w"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mtpcheck",
            "roundtrip",
            str(FIXTURES / "mimo"),
            "--workdir",
            str(work),
            "--to-hf",
            f"{DAMAGING} hang {{src}} {{dst}}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a background job of a non-interactive shell inherits SIGINT ignored; the user's ^C
        # is what this test is about
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        runs = list(work.glob("*/hf/started")) if work.exists() else []
        if runs:
            break
        time.sleep(0.2)
    assert runs, "stage 2's converter never started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert os.listdir(work) == []


def test_intermediates_skip_fsync_but_conversions_do_not(
    run_cli, tmp_path: Path, monkeypatch
) -> None:
    """The round trip's checkpoints are read back and deleted: no fsync (like cp). ``convert``
    writes a checkpoint to keep: its data files are fsynced."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run = run_cli("roundtrip", FIXTURES / "mimo", "--workdir", tmp_path / "rt", "--format", "json")
    assert run.exit_code == 0, run
    data = [p for p in synced if p.endswith((".distcp", ".safetensors"))]
    assert data == []

    megatron = tmp_path / "megatron"
    assert run_cli("convert", "hf-to-megatron", FIXTURES / "mimo", megatron).exit_code == 0
    back = tmp_path / "back"
    config = FIXTURES / "mimo" / "config.json"
    run = run_cli("convert", "megatron-to-hf", megatron, back, "--hf-config", config)
    assert run.exit_code == 0, run
    assert {Path(p).name for p in synced if p.endswith(".distcp")} == {
        p.name for p in (megatron / "release").glob("*.distcp")
    }
    assert {Path(p).name for p in synced if p.endswith(".safetensors")} == {
        p.name for p in back.glob("*.safetensors")
    }


def test_each_checkpoint_is_opened_once(tmp_path: Path, monkeypatch) -> None:
    """Opening a Megatron checkpoint unpickles its metadata: the round trip does it once."""
    from mtpcheck.pipeline import roundtrip, stages
    from mtpcheck.pipeline.options import RoundtripOptions

    opened: list[str] = []
    real_open = roundtrip.open_checkpoint

    def counting(path: Path, *args: Any) -> Any:
        opened.append(Path(path).name)
        return real_open(path, *args)

    for module in (roundtrip, stages):  # the source is opened by one, the outputs by the other
        monkeypatch.setattr(module, "open_checkpoint", counting)
    opts = RoundtripOptions(FIXTURES / "mimo", workdir=tmp_path)
    report = roundtrip.run_roundtrip(opts, lambda line: None)
    assert report.ok
    assert opened == ["mimo", "megatron", "hf"]


def _talking_converter(tmp_path: Path) -> str:
    """A converter that says something, then waits for a ``go`` file before it ends."""
    script = tmp_path / "talk.py"
    script.write_text(
        "import sys, time, pathlib\n"
        "print('converting shard 1 of 2', file=sys.stderr, flush=True)\n"
        f"go = pathlib.Path({str(tmp_path / 'go')!r})\n"
        "deadline = time.monotonic() + 60\n"
        "while not go.exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "print('converting shard 2 of 2', file=sys.stderr, flush=True)\n"
    )
    return f"{sys.executable} {script} {{src}} {{dst}}"


def test_a_converters_stderr_is_streamed_while_it_runs(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mtpcheck",
            "roundtrip",
            str(FIXTURES / "mimo"),
            "--workdir",
            str(tmp_path / "w"),
            "--format",
            "json",
            "--to-megatron",
            _talking_converter(tmp_path),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # the converter is still waiting for "go" here
        seen.append(line)
        if "converting shard 1" in line:
            break
    assert seen[-1] == "mtpcheck: stage 1 converter | converting shard 1 of 2\n"
    (tmp_path / "go").touch()
    out, rest = proc.communicate(timeout=120)
    assert "mtpcheck: stage 1 converter | converting shard 2 of 2\n" in rest
    assert proc.returncode == 1  # it wrote nothing: a finding
    assert json.loads(out)["ok"] is False  # stdout is the report alone


def test_quiet_leaves_stderr_to_errors(tmp_path: Path) -> None:
    (tmp_path / "go").touch()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtpcheck",
            "roundtrip",
            str(FIXTURES / "mimo"),
            "--workdir",
            str(tmp_path / "w"),
            "--quiet",
            "--format",
            "json",
            "--to-megatron",
            _talking_converter(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr == ""
    assert json.loads(done.stdout)["ok"] is False


def test_timings_name_each_part_with_the_bytes_it_moved(
    run_cli, tmp_path: Path, monkeypatch
) -> None:
    """``MTPCHECK_TIMINGS`` (the scale benchmark's channel): every part of the round trip, in
    the order it ran, with the bytes each stage wrote and each comparison read; the report is
    the one a run without it gives."""
    plain = _report(
        run_cli("roundtrip", FIXTURES / "mimo", "--workdir", tmp_path, "--format", "json")
    )
    timings = tmp_path / "timings.json"
    monkeypatch.setenv("MTPCHECK_TIMINGS", str(timings))
    run = run_cli("roundtrip", FIXTURES / "mimo", "--workdir", tmp_path / "w", "--format", "json")
    assert run.exit_code == 0, run
    timed = _report(run)
    assert _statuses(timed) == _statuses(plain) and timed["tensors"] == plain["tensors"]
    stages = json.loads(timings.read_text())["stages"]
    assert [s["stage"] for s in stages] == [
        "source-audit",
        "stage1-import",
        "stage1-convert",
        "stage1-open",
        "stage2-convert",
        "stage2-open",
        "compare-stage1",
        "compare-stage2",
        "cleanup",
    ]
    assert all(s["seconds"] >= 0 for s in stages)
    moved = {s["stage"]: s["bytes"] for s in stages}
    source = sum(p.stat().st_size for p in (FIXTURES / "mimo").glob("*.safetensors"))
    assert moved["stage1-convert"] > 0.9 * source  # the tensors, in torch_dist records
    assert moved["stage2-convert"] > 0.9 * source
    assert moved["compare-stage2"] == 2 * sum(t["nbytes"] for t in timed["tensors"])
