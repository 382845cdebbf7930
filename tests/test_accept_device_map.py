"""accept --device-map: the main model placed by accelerate (offloaded to disk here, on CPU)
gives exactly the figures of the model loaded whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpcheck.accept.device_map import resolve_device_map
from mtpcheck.accept.loading import Drafter, open_drafter
from mtpcheck.errors import MtpcheckError
from tests.conftest import FIXTURES

FIXTURE = FIXTURES / "accept_deepseek_v3"
WORKLOAD = FIXTURE / "workloads" / "in_domain.jsonl"
OFFLOADED = {
    "model.embed_tokens": "cpu",
    "model.layers.0": "disk",
    "model.layers.1": "cpu",
    "model.norm": "cpu",
    "model.rotary_emb": "cpu",
    "lm_head": "disk",
}


@pytest.fixture
def offload_map(tmp_path: Path) -> Path:
    path = tmp_path / "map.json"
    path.write_text(json.dumps(OFFLOADED))
    return path


def test_disk_offload_really_offloads(offload_map: Path) -> None:
    drafter = open_drafter(
        FIXTURE, dtype="float32", device_map=resolve_device_map(str(offload_map))
    )
    assert isinstance(drafter, Drafter)
    layer0 = next(drafter.model.model.layers[0].parameters())
    layer1 = next(drafter.model.model.layers[1].parameters())
    assert (layer0.device.type, layer1.device.type) == ("meta", "cpu")  # loaded per forward
    [folder] = drafter.keep  # where accelerate may write what it offloads, kept while loaded
    assert Path(folder.name).is_dir()


@pytest.mark.parametrize("extra", [(), ("--online", "--new-tokens", "16")])
def test_placed_model_gives_the_same_figures(offload_map: Path, extra, run_cli) -> None:
    args = ("accept", FIXTURE, "--workload", f"d={WORKLOAD}", "--temperature", "0", *extra)
    whole = run_cli(*args, "--format", "json")
    assert whole.exit_code == 0, whole
    for placement in (str(offload_map), "auto"):
        placed = run_cli(*args, "--device-map", placement, "--format", "json")
        assert placed.exit_code == 0, placed
        a, b = json.loads(whole.stdout), json.loads(placed.stdout)
        assert a["acceptance"] == b["acceptance"]
        assert a.get("online_acceptance") == b.get("online_acceptance")
    assert json.loads(whole.stdout)["acceptance"][0]["greedy_hits"] == 1915


def test_a_bad_map_is_one_line_and_exit_2(tmp_path: Path, run_cli) -> None:
    bad = tmp_path / "map.json"
    bad.write_text('{"model.layers.0": -1}')
    run = run_cli("accept", FIXTURE, "--workload", f"d={WORKLOAD}", "--device-map", bad)
    assert run.exit_code == 2 and run.stdout == ""
    assert run.stderr.strip() == (
        f"mtpcheck: error: {bad}: 'model.layers.0': device -1 is not a name or a GPU index"
    )


def test_without_accelerate_the_option_says_what_to_install(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "accelerate" else real(name, *a),
    )
    with pytest.raises(MtpcheckError, match=r"pip install 'mtpcheck\[accelerate\]'"):
        resolve_device_map("auto")
