"""Real damage, built for real, and the exact finding mtpcheck reports for it."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES, Run, flip_bit, write_safetensors

DS = FIXTURES / "deepseek_v3"
SHARD2 = "model-00002-of-00002.safetensors"


def _json(run: Run) -> dict[str, Any]:
    return json.loads(run.stdout)


def _findings(report: dict[str, Any], check: str) -> list[tuple[str, str, str]]:
    (c,) = [c for c in report["checks"] if c["name"] == check]
    return [(f["status"], f["subject"], f["message"]) for f in c["findings"]]


def _failing(report: dict[str, Any], check: str) -> list[tuple[str, str]]:
    return [(s, m) for st, s, m in _findings(report, check) if st == "fail"]


def _set_config(path: Path, **changes: Any) -> None:
    config = json.loads((path / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (path / "config.json").write_text(json.dumps(config))


def _rewrite(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Load a safetensors file with torch, edit its tensors, save it back."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_transformers_save_pretrained_drops_mtp_and_keeps_the_count(
    tmp_path: Path, run_cli: Callable[..., Run]
) -> None:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(DS)
    out = tmp_path / "resaved"
    model.save_pretrained(out)

    inspected = run_cli("inspect", out, "--format", "json")
    assert inspected.exit_code == 1, inspected
    report = _json(inspected)
    assert _failing(report, CheckName.MTP_COUNT) == [
        (
            "mtp-count",
            "config declares 1 MTP layer(s) (num_nextn_predict_layers) but the checkpoint "
            "holds no MTP weights",
        )
    ]
    assert report["inputs"][0]["declared_mtp_layers"] == 1

    diffed = run_cli("diff", DS, out, "--format", "json")
    assert diffed.exit_code == 1, diffed
    missing = {
        s for s, m in _failing(_json(diffed), CheckName.TENSORS) if m.startswith("missing in B")
    }
    mtp = {n for n in open_checkpoint(DS).tensors if n.startswith("model.layers.2.")}
    assert missing == mtp and len(mtp) == 32
    assert _failing(_json(diffed), CheckName.CONFIG) == []

    # A pre-release gate must fail here too: the round trip audits the source and converts
    # nothing, so no stage is blamed for what the source already lost.
    tripped = run_cli("roundtrip", out, "--workdir", tmp_path, "--format", "json")
    assert tripped.exit_code == 1, tripped
    report = _json(tripped)
    failed = {c["name"] for c in report["checks"] if c["status"] == "fail"}
    assert failed == {CheckName.SOURCE_MTP_COUNT, CheckName.SOURCE_MTP_LAYERS}
    assert [c["name"] for c in report["checks"]][-1] == "stage1-convert"
    assert _findings(report, CheckName.STAGE1_CONVERT)[0][0] == "skip"
    assert list(tmp_path.glob("mtpcheck-roundtrip-*")) == []
    assert _failing(report, CheckName.SOURCE_MTP_COUNT) == [
        (
            "mtp-count",
            "config declares 1 MTP layer(s) (num_nextn_predict_layers) but the checkpoint "
            "holds no MTP weights",
        )
    ]
    ((subject, message),) = _failing(report, CheckName.SOURCE_MTP_LAYERS)
    assert subject == "mtp layer 0"
    assert message.startswith("model.layers.2.: 32 of 32 tensors missing: ")


def test_one_bit_flip_in_the_projection(fixture_copy: Callable[[str], Path], run_cli) -> None:
    damaged = fixture_copy("deepseek_v3")
    meta = open_checkpoint(damaged).tensors["model.layers.2.eh_proj.weight"]
    element = 37  # row 1, column 5 of a [16, 32] bf16 tensor
    flip_bit(Path(meta.file), meta.offset + 2 * element, bit=0)

    run = run_cli("diff", DS, damaged, "--format", "json")
    assert run.exit_code == 1, run
    (failure,) = _failing(_json(run), CheckName.TENSORS)
    assert failure[0] == "model.layers.2.eh_proj.weight"
    assert failure[1].startswith("bits differ in 1 of 512 elements, first at index [1, 5]")
    (entry,) = [t for t in _json(run)["tensors"] if t["status"] != "equal"]
    assert entry["differing_elements"] == 1 and entry["first_difference"] == [1, 5]
    assert 0 < entry["max_abs_diff"] < 1e-3


def test_swapped_projection_halves(fixture_copy, run_cli) -> None:
    damaged = fixture_copy("mimo")
    name = "model.mtp_layers.0.input_proj.weight"

    def swap(t: dict[str, Any]) -> None:
        import torch

        w = t[name]
        h = w.shape[0]
        t[name] = torch.cat([w[:, h:], w[:, :h]], dim=1).contiguous()

    _rewrite(damaged / "model.safetensors", swap)
    run = run_cli("diff", FIXTURES / "mimo", damaged, "--format", "json")
    assert run.exit_code == 1, run
    (failure,) = _failing(_json(run), CheckName.TENSORS)
    assert failure[0] == name
    assert failure[1].startswith("bits differ in 512 of 512 elements, first at index [0, 0]")


def test_dtype_upcast_is_reported_not_silently_compared(fixture_copy, run_cli) -> None:
    damaged = fixture_copy("deepseek_v3")
    name = "model.layers.2.eh_proj.weight"

    def upcast(t: dict[str, Any]) -> None:
        import torch

        t[name] = t[name].to(torch.float32)

    _rewrite(damaged / SHARD2, upcast)
    run = run_cli("diff", DS, damaged, "--format", "json")
    assert run.exit_code == 0, run  # every value kept: a warning, not a failure
    kept = "dtype changed BF16 -> F32 (every value kept: the wider type holds each exactly)"
    assert [(s, m) for st, s, m in _findings(_json(run), CheckName.TENSORS) if st == "warn"] == [
        (name, kept)
    ]
    assert _failing(_json(run), CheckName.TENSORS) == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            None,
            "1 MTP layer(s) present but undeclared (no num_nextn_predict_layers in config); "
            "serving engines read the count key and will not load them",
        ),
        (
            0,
            "1 MTP layer(s) present but config declares 0 (num_nextn_predict_layers); "
            "serving engines read the count key and will not load them",
        ),
        (2, "config declares 2 (num_nextn_predict_layers); 1 present, 1 complete"),
    ],
)
def test_count_key_removed_zeroed_or_too_high(fixture_copy, run_cli, value, message) -> None:
    damaged = fixture_copy("glm4_moe")
    _set_config(damaged, num_nextn_predict_layers=value)
    run = run_cli("inspect", damaged, "--format", "json")
    assert run.exit_code == 1, run
    assert _failing(_json(run), CheckName.MTP_COUNT) == [("mtp-count", message)]
    diffed = _json(run_cli("diff", FIXTURES / "glm4_moe", damaged, "--format", "json"))
    shown = "(absent)" if value is None else repr(value)
    assert _failing(diffed, CheckName.CONFIG) == [("num_nextn_predict_layers", f"1 -> {shown}")]


def test_diverged_shared_copy(fixture_copy, run_cli) -> None:
    damaged = fixture_copy("glm4_moe")
    meta = open_checkpoint(damaged).tensors["model.layers.2.shared_head.head.weight"]
    flip_bit(Path(meta.file), meta.offset + 2 * 100 + 1, bit=6)
    run = run_cli("inspect", damaged, "--format", "json")
    assert run.exit_code == 1, run
    ((subject, message),) = _failing(_json(run), CheckName.SHARED_COPIES)
    assert subject == "model.layers.2.shared_head.head.weight"
    assert message.startswith(
        "diverged from lm_head.weight: bits differ in 1 of 1024 elements, first at index [6, 4]"
    )


def _floats(tmp_path: Path, name: str, values: list[bytes]) -> Path:
    d = tmp_path / name
    d.mkdir()
    write_safetensors(
        d / "model.safetensors", {"lm_head.weight": ("F32", [len(values)], b"".join(values))}
    )
    return d


def test_negative_zero_differs_and_identical_nans_are_equal(tmp_path: Path, run_cli) -> None:
    nan = struct.pack("<I", 0x7FC00123)
    pos, neg, one = struct.pack("<f", 0.0), struct.pack("<f", -0.0), struct.pack("<f", 1.0)
    assert math.isnan(struct.unpack("<f", nan)[0])
    base = _floats(tmp_path, "a", [one, pos, nan])
    same_nan = _floats(tmp_path, "b", [one, pos, nan])
    negzero = _floats(tmp_path, "c", [one, neg, nan])
    other_nan = _floats(tmp_path, "d", [one, pos, struct.pack("<I", 0x7FC00124)])

    assert run_cli("diff", base, same_nan).exit_code == 0
    run = run_cli("diff", base, negzero, "--format", "json")
    assert run.exit_code == 1
    assert _failing(_json(run), CheckName.TENSORS) == [
        ("lm_head.weight", "bits differ in 1 of 3 elements, first at index [1]; max abs diff 0")
    ]
    run = run_cli("diff", base, other_nan, "--format", "json")
    assert _failing(_json(run), CheckName.TENSORS) == [
        ("lm_head.weight", "bits differ in 1 of 3 elements, first at index [2]")
    ]


def test_truncated_shard(fixture_copy, run_cli) -> None:
    damaged = fixture_copy("deepseek_v3")
    shard = damaged / SHARD2
    shard.write_bytes(shard.read_bytes()[:-100])
    run = run_cli("inspect", damaged, "--format", "json")
    assert run.exit_code == 1, run
    ((subject, message),) = _failing(_json(run), CheckName.INTEGRITY)
    assert subject == SHARD2
    assert message == (
        f"{SHARD2} is truncated: header declares 13752 data bytes, the file holds 13652 "
        "(3 tensors cut off: model.layers.2.shared_head.head.weight, "
        "model.layers.2.shared_head.norm.weight, model.norm.weight)"
    )
    # the MTP layer is not whole when some of its bytes are gone, and a cut-off copy is not
    # "diverged": it could not be compared
    assert _failing(_json(run), CheckName.MTP_LAYERS) == [
        (
            "mtp layer 0",
            "model.layers.2.: 2 of 32 tensors unreadable (their bytes are cut off): "
            "model.layers.2.shared_head.head.weight, model.layers.2.shared_head.norm.weight",
        )
    ]
    assert _failing(_json(run), CheckName.SHARED_COPIES) == [
        (
            "model.layers.2.shared_head.head.weight",
            "not compared with lm_head.weight: the bytes of "
            "model.layers.2.shared_head.head.weight are cut off (file truncated)",
        )
    ]
    (layer,) = _json(run)["inputs"][0]["mtp_layers"]
    assert layer["complete"] is False and len(layer["unreadable"]) == 2
    diffed = run_cli("diff", DS, damaged, "--format", "json")
    assert diffed.exit_code == 1, diffed
    assert _failing(_json(diffed), CheckName.TENSORS) == [
        ("model.layers.2.shared_head.head.weight", "bytes unreadable (file truncated)"),
        ("model.layers.2.shared_head.norm.weight", "bytes unreadable (file truncated)"),
    ]


def test_missing_shard(fixture_copy, run_cli) -> None:
    damaged = fixture_copy("deepseek_v3")
    (damaged / SHARD2).unlink()
    report = _json(run_cli("inspect", damaged, "--format", "json"))
    assert _failing(report, CheckName.INTEGRITY) == [
        (SHARD2, f"index names shard {SHARD2} (34 tensors) but the file is missing")
    ]
    assert _failing(report, CheckName.MTP_COUNT)[0][1].endswith("holds no MTP weights")


def test_corrupt_header_exits_2_with_one_line(fixture_copy, run_cli) -> None:
    damaged = fixture_copy("deepseek_v3")
    with open(damaged / SHARD2, "r+b") as f:
        f.seek(8)
        f.write(b"#")
    run = run_cli("inspect", damaged)
    assert run.exit_code == 2, run
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith(f"mtpcheck: error: {damaged / SHARD2}: header is not valid JSON")
    assert "Traceback" not in run.stderr


def test_malformed_config_exits_2(fixture_copy, run_cli) -> None:
    damaged = fixture_copy("qwen3_next")
    (damaged / "config.json").write_text('{"model_type": "qwen3_next",')
    run = run_cli("inspect", damaged)
    assert run.exit_code == 2, run
    assert run.stderr.startswith(f"mtpcheck: error: {damaged / 'config.json'}: invalid JSON")
    assert run.stderr.count("\n") == 1
