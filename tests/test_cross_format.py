"""inspect and diff on Megatron checkpoints, and diff across HF and Megatron."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtpcheck import CheckName
from mtpcheck.convert.builtin import hf_to_megatron
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES

HF = FIXTURES / "glm4_moe"
DAMAGING = Path(__file__).parent / "converters" / "damaging.py"


@pytest.fixture(scope="module")
def megatron(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("megatron") / "save"
    hf_to_megatron(open_checkpoint(HF), root)
    return root


@pytest.fixture(scope="module")
def megatron_without_mtp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("no_mtp") / "save"
    subprocess.run(
        [sys.executable, str(DAMAGING), "drop-mtp-weights", str(HF), str(root)], check=True
    )
    return root


def _failing(stdout: str, check: str) -> list[tuple[str, str]]:
    (c,) = [c for c in json.loads(stdout)["checks"] if c["name"] == check]
    return [(f["subject"], f["message"]) for f in c["findings"] if f["status"] == "fail"]


def test_inspect_megatron_save_root(run_cli, megatron: Path) -> None:
    run = run_cli("inspect", megatron, "--format", "json")
    assert run.exit_code == 0, run
    (inp,) = json.loads(run.stdout)["inputs"]
    assert inp["format"] == "megatron-torch-dist"
    assert (inp["family"], inp["declared_mtp_layers"], inp["declared_by"]) == (
        "megatron",
        1,
        "mtp_num_layers",
    )
    assert inp["mtp_layers"][0]["complete"]


@pytest.mark.parametrize("order", ["hf-first", "megatron-first"])
def test_diff_across_formats_is_bit_exact(run_cli, megatron: Path, order: str) -> None:
    a, b = (HF, megatron) if order == "hf-first" else (megatron, HF)
    run = run_cli("diff", a, b, "--all", "--format", "json")
    assert run.exit_code == 0, run
    tensors = json.loads(run.stdout)["tensors"]
    assert len(tensors) == 54 and {t["status"] for t in tensors} == {"equal"}
    assert "mtp.layers.0.transformer_layer.self_attention.linear_qkv.weight" in {
        t["name"] for t in tensors
    }


def test_megatron_without_mtp_weights(run_cli, megatron_without_mtp: Path) -> None:
    run = run_cli("inspect", megatron_without_mtp, "--format", "json")
    assert run.exit_code == 1, run
    assert _failing(run.stdout, CheckName.MTP_COUNT) == [
        (
            "mtp-count",
            "config declares 1 MTP layer(s) (mtp_num_layers) but the checkpoint holds no "
            "MTP weights",
        )
    ]
    diffed = run_cli("diff", HF, megatron_without_mtp, "--format", "json")
    assert diffed.exit_code == 1, diffed
    missing = dict(_failing(diffed.stdout, CheckName.TENSORS))
    assert missing["mtp.layers.0.eh_proj.weight"] == "missing in B (was BF16[16, 32])"
    assert len(missing) == 23  # the whole Megatron MTP layer; embedding and head still match


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_malicious_common_pt_exits_2_and_runs_nothing(
    run_cli, megatron: Path, tmp_path: Path
) -> None:
    copy = Path(shutil.copytree(megatron, tmp_path / "save"))
    marker = tmp_path / "pwned"
    common = copy / "release" / "common.pt"
    torch.save({"args": _Payload(marker)}, common)
    run = run_cli("inspect", copy)
    assert run.exit_code == 2, run
    assert run.stderr.startswith(f"mtpcheck: error: {common}: refusing to unpickle ")
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert not marker.exists()
