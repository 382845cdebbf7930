"""The pipeline commands on inputs users really bring: what each says, and what it leaves."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.families.definitions import definition_of
from mtpcheck.formats.hub_ref import parse_ref
from mtpcheck.pipeline import gated_convert
from mtpcheck.pipeline.output_dir import fresh_output
from tests.conftest import FIXTURES, Run

DS = FIXTURES / "deepseek_v3"


def _report(run: Run) -> dict[str, Any]:
    return json.loads(run.stdout)


# --- convert writes all or nothing -----------------------------------------------------------


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_a_conversion_that_stops_half_way_leaves_nothing(
    failure: type[BaseException],
    tmp_path: Path,
    run_cli: Callable[..., Run],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from mtpcheck.convert import builtin

    real = builtin.hf_to_megatron

    def half_way(hf: Any, dst: Path, **kwargs: Any) -> Path:
        real(hf, dst, **kwargs)  # a whole checkpoint in the hidden folder, then
        raise failure("stopped")

    monkeypatch.setattr(builtin, "hf_to_megatron", half_way)
    dst = tmp_path / "nested" / "out"
    run = run_cli("convert", "hf-to-megatron", DS, dst)
    assert run.exit_code == (130 if failure is KeyboardInterrupt else 3), run
    assert list(tmp_path.iterdir()) == []  # neither the folder nor the parent made for it


def test_an_empty_destination_folder_is_filled_and_kept_on_failure(
    tmp_path: Path, run_cli: Callable[..., Run]
) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    damaged = tmp_path / "src"
    damaged.mkdir()
    for f in DS.iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    config = json.loads((damaged / "config.json").read_text())
    (damaged / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 3}))
    refused = run_cli("convert", "hf-to-megatron", damaged, dst)
    assert refused.exit_code == 1 and refused.stderr.startswith("mtpcheck: refused: "), refused
    assert dst.is_dir() and list(dst.iterdir()) == []  # as it was
    written = run_cli("convert", "hf-to-megatron", DS, dst)
    assert written.exit_code == 0, written
    assert sorted(p.name for p in dst.iterdir()) == ["latest_checkpointed_iteration.txt", "release"]
    assert oct(dst.stat().st_mode & 0o777) != oct(0o700)  # not mkdtemp's private mode
    assert [p.name for p in tmp_path.iterdir() if ".partial-" in p.name] == []


def test_fresh_output_removes_the_hidden_folder_on_any_exception(tmp_path: Path) -> None:
    dst = tmp_path / "a" / "b"
    with pytest.raises(ValueError), fresh_output(dst) as partial:
        (partial / "half.bin").write_bytes(b"x")
        assert partial.parent == tmp_path / "a" and partial.name.startswith(".b.partial-")
        raise ValueError
    assert list(tmp_path.iterdir()) == []


def test_megatron_to_hf_refuses_a_damaged_megatron_source(
    tmp_path: Path, run_cli: Callable[..., Run]
) -> None:
    from mtpcheck.convert.builtin import hf_to_megatron
    from mtpcheck.formats import open_checkpoint

    megatron = hf_to_megatron(open_checkpoint(DS), tmp_path / "mg").parent
    (data,) = (megatron / "release").glob("*.distcp")
    data.write_bytes(data.read_bytes()[:-1])
    # --hf-config takes the config file or the folder holding it, as roundtrip --synthetic does
    for config in (DS / "config.json", DS):
        run = run_cli("convert", "megatron-to-hf", megatron, tmp_path / "hf", "--hf-config", config)
        assert run.exit_code == 1, run
        assert run.stderr.startswith(
            f"mtpcheck: refused: {megatron}: not converted: the source fails its audit: "
            f"integrity: {data.name}: {data.name} is "
        )
        assert not (tmp_path / "hf").exists()
    # a folder without one is named, exit 2
    empty = tmp_path / "no-config"
    empty.mkdir()
    run = run_cli("convert", "megatron-to-hf", megatron, tmp_path / "hf", "--hf-config", empty)
    assert run.exit_code == 2, run
    assert str(empty / "config.json") in run.stderr


def test_gated_convert_checks_the_destination_before_reading_the_source(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    with pytest.raises(Exception, match="destination exists and is not empty"):
        gated_convert.hf_to_megatron(tmp_path / "no-such-source", full, lambda line: None)


# --- roundtrip -------------------------------------------------------------------------------


def test_keep_says_where_even_when_quiet(run_cli: Callable[..., Run], tmp_path: Path) -> None:
    run = run_cli("roundtrip", FIXTURES / "mimo", "--workdir", tmp_path, "--keep", "-q")
    assert run.exit_code == 0, run
    (kept,) = tmp_path.iterdir()
    assert run.stderr == f"mtpcheck: kept the round trip's checkpoints in {kept}\n"


def test_synthetic_builds_the_declared_count_zero_too(
    run_cli: Callable[..., Run], tmp_path: Path
) -> None:
    config = json.loads((DS / "config.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    run = run_cli("roundtrip", path, "--synthetic", "--workdir", tmp_path / "w", "--format", "json")
    assert run.exit_code == 0, run
    source = _report(run)["inputs"][0]
    assert source["declared_mtp_layers"] == 0 and source["mtp_layers"] == []
    checks = {c["name"]: c for c in _report(run)["checks"]}
    assert checks[CheckName.SOURCE_MTP_COUNT]["findings"][0]["message"] == (
        "config declares 0 MTP layers (num_nextn_predict_layers); none present"
    )


def test_roundtrip_source_stage_names_the_main_model_it_checked(
    run_cli: Callable[..., Run], tmp_path: Path
) -> None:
    run = run_cli("roundtrip", DS, "--workdir", tmp_path, "--format", "json")
    assert run.exit_code == 0, run
    checks = {c["name"]: c for c in _report(run)["checks"]}
    assert checks[CheckName.SOURCE_MCORE_MODEL]["findings"][0]["message"] == (
        "35 main-model tensors, as megatron-core's model of the config holds them"
    )
    assert checks[CheckName.SOURCE_MAIN_MODEL]["findings"][0]["message"] == (
        "2 of 2 decoder layers present, 1 with all 4 routed experts; embedding, final norm and "
        "head present; each layer held to the others of its kind (2 kinds) and to "
        f"{definition_of('deepseek_v3').source}'s DeepseekV3ForCausalLM"  # type: ignore[union-attr]
    )


# --- inspect / accept on mistakes a user makes ----------------------------------------------


def test_a_mistyped_local_path_is_not_a_hub_lookup(
    tmp_path: Path, run_cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fixtures").mkdir()
    monkeypatch.chdir(tmp_path)
    assert parse_ref("fixtures/mimoo") is None
    assert parse_ref("some-org/some-model") is not None  # no such local folder: the Hub
    run = run_cli("inspect", "fixtures/mimoo")
    assert run.exit_code == 2
    assert run.stderr == "mtpcheck: error: fixtures/mimoo: no such file or directory\n"


def test_no_config_json_is_said_as_such(tmp_path: Path, run_cli: Callable[..., Run]) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in DS.glob("*.safetensors"):
        (bare / f.name).write_bytes(f.read_bytes())
    report = _report(run_cli("inspect", bare, "--format", "json"))
    (family,) = [c for c in report["checks"] if c["name"] == CheckName.FAMILY]
    assert family["findings"][0]["subject"] == "config.json"
    assert family["findings"][0]["message"].startswith("no config.json, so no model_type: ")
    (integrity,) = [c for c in report["checks"] if c["name"] == CheckName.INTEGRITY]
    assert integrity["findings"][0]["message"] == (
        "73 tensors in 2 file(s); headers (no index) consistent"
    )


@pytest.mark.parametrize(
    ("path", "said"),
    [
        (FIXTURES / "mimo", "1 file(s); header consistent"),
        (DS, "2 file(s); headers and index consistent"),
        (Path(__file__).parent / "data" / "megatron_lm_0192", ".metadata and the data files"),
    ],
)
def test_the_integrity_line_says_what_was_cross_checked(
    path: Path, said: str, run_cli: Callable[..., Run]
) -> None:
    report = _report(run_cli("inspect", path, "--format", "json"))
    (integrity,) = [c for c in report["checks"] if c["name"] == CheckName.INTEGRITY]
    assert said in integrity["findings"][0]["message"]
    assert "index" not in integrity["findings"][0]["message"] or path == DS


def test_accept_reads_its_workloads_before_importing_torch(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from mtpcheck.cli import main\n"
        f"rc = main(['accept', {str(FIXTURES / 'accept_deepseek_v3')!r}, "
        f"'--workload', 'x={tmp_path / 'nope.jsonl'}'])\n"
        "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.split() == ["2", "False", "False"], done
    assert done.stderr == f"mtpcheck: error: {tmp_path / 'nope.jsonl'}: no such file or directory\n"
