"""SGLang's ``scripts/export_deepseek_nextn.py``, run as published on the DeepSeek-V3 fixture
(``tests/thirdparty/sglang``, NOTES.md there): the exported NextN layer is compared with the
target's MTP layer bit for bit, in the export's names and with an extraction's scope (the main
model absent, one hidden layer, the embedding and head left out on purpose)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES, flip_bit, tensor_offset
from tests.report_views import findings_of, report_of

SGLANG = Path(__file__).resolve().parent / "data" / "sglang"
NEXTN = SGLANG / "deepseek_v3-nextn"
SKIPPED = SGLANG / "deepseek_v3-nextn-skipped-shard"
TARGET = FIXTURES / "deepseek_v3"
LAYER_FILE = "nextn_layer_parameters.safetensors"


def _checks(report: dict[str, Any]) -> list[str]:
    return [c["name"] for c in report["checks"]]


def test_the_export_is_the_targets_mtp_layer_bit_for_bit(run_cli) -> None:
    code, report = report_of(run_cli, "inspect", NEXTN, "--target", TARGET)
    assert code == 0
    assert findings_of(report, CheckName.DRAFTER_MTP) == [
        (
            "pass",
            "mtp layer",
            "30 tensors bit-identical to the target's model.layers.2.* (7576 bytes); left out "
            "on purpose: model.layers.2.embed_tokens.weight, "
            "model.layers.2.shared_head.head.weight",
        )
    ]
    assert report["inputs"][0]["family_display"] == (
        "drafter: DeepSeek NextN layer exported by SGLang"
    )
    # an extraction keeps its target's model_type: the model checks are not its scope
    assert not {CheckName.MAIN_MODEL, CheckName.MTP_COUNT, CheckName.MTP_LAYERS} & set(
        _checks(report)
    )


def test_alone_the_export_is_checked_by_its_kind_and_says_what_needs_the_target(run_cli) -> None:
    code, report = report_of(run_cli, "inspect", NEXTN)
    assert code == 0
    assert findings_of(report, CheckName.PAIRING) == [
        (
            "skip",
            "target",
            "not checked without --target TARGET: the MTP layer against the target's, bit for bit",
        )
    ]
    assert findings_of(report, CheckName.DRAFTER_SERVING)[0] == (
        "info",
        "SGLang",
        f"--speculative-algorithm NEXTN --speculative-draft-model-path {NEXTN}",
    )


def test_a_shard_the_exporter_skipped_fails_with_every_lost_tensor(run_cli) -> None:
    """The exporter printed its read error for the shard holding the MTP layer, went on and
    wrote no tensor of it (NOTES.md); exit 0 on its side."""
    code, report = report_of(run_cli, "inspect", SKIPPED, "--target", TARGET)
    assert code == 1
    [left_out] = findings_of(report, CheckName.DRAFTER_MTP)
    assert left_out[:2] == ("fail", "left out")
    assert left_out[2].startswith(
        "30 of the target MTP layer's 30 tensors are absent from the drafter (an exporter "
        "that skipped what it could not read): "
    )
    assert (
        "fail",
        "model.layers.0.eh_proj.weight",
        "absent: every drafter of this kind holds it",
    ) in (findings_of(report, CheckName.DRAFTER_TENSORS))


def test_one_flipped_bit_of_the_export_fails_by_name(run_cli, tmp_path: Path) -> None:
    damaged = tmp_path / "nextn"
    shutil.copytree(NEXTN, damaged)
    shard = damaged / LAYER_FILE
    flip_bit(shard, tensor_offset(shard, "model.layers.0.eh_proj.weight") + 6, bit=3)
    code, report = report_of(run_cli, "inspect", damaged, "--target", TARGET)
    assert code == 1
    [(status, subject, message)] = findings_of(report, CheckName.DRAFTER_MTP)
    assert (status, subject) == ("fail", "model.layers.0.eh_proj.weight")
    assert "1 of" in message and "differ" in message


@pytest.mark.parametrize("order", ["target-first", "drafter-first"])
def test_diff_compares_the_export_with_the_targets_mtp_layer(run_cli, order: str) -> None:
    pair = (TARGET, NEXTN) if order == "target-first" else (NEXTN, TARGET)
    code, report = report_of(run_cli, "diff", *pair)
    assert code == 0
    assert _checks(report) == [CheckName.INTEGRITY, CheckName.SCOPE, CheckName.DRAFTER_MTP]
    [(status, _, message)] = findings_of(report, CheckName.DRAFTER_MTP)
    assert status == "pass" and message.startswith("30 tensors bit-identical")
    assert len(report["tensors"]) == 30


def test_target_of_a_model_that_is_no_drafter_is_refused_in_one_line(run_cli) -> None:
    run = run_cli("inspect", TARGET, "--target", TARGET)
    assert run.exit_code == 2
    assert run.stderr.strip().splitlines() == [
        f"mtpcheck: error: {TARGET}: --target: this is not a drafter that ships beside its "
        "target (model_type 'deepseek_v3'); it is audited alone"
    ]
