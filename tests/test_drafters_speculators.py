"""Drafters written by speculators 0.9.0 itself (``tests/thirdparty/speculators``, NOTES.md
there; rewritten afresh in CI, ``MTPCHECK_TOOL_OUTPUTS``) audited alone and against the tiny
Llama target they were built for: the intact ones pass, each defect of the kinds that headers
and small reads show fails with its cause."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES, flip_bit, tensor_offset
from tests.report_views import failing_of, findings_of, report_of
from tests.thirdparty.tools import tool_output

DATA = tool_output("speculators")
TARGET = DATA / "llama-target"


@pytest.mark.parametrize(
    ("case", "kind"),
    [
        ("eagle3", "eagle3-speculators"),
        ("eagle3-4aux", "eagle3-speculators"),
        ("eagle3-shared-embed", "eagle3-speculators"),
        ("peagle", "peagle"),
        ("dflash", "dflash-speculators"),
    ],
)
def test_intact_drafters_pass_with_their_target(run_cli, case: str, kind: str) -> None:
    code, report = report_of(run_cli, "inspect", DATA / case, "--target", TARGET)
    assert (code, failing_of(report)) == (0, [])
    assert findings_of(report, CheckName.DRAFTER_KIND)[0][:2] == ("pass", kind)
    assert findings_of(report, CheckName.PAIRING_SHAPE) == [
        ("pass", "vocabulary", "256, as the target's"),
        ("pass", "width", "64, as the target's"),
    ]


def test_the_eagle3_drafter_is_checked_whole(run_cli) -> None:
    code, report = report_of(run_cli, "inspect", DATA / "eagle3", "--target", TARGET)
    assert code == 0
    assert findings_of(report, CheckName.DRAFTER_TENSORS) == [
        (
            "pass",
            "tensors",
            "the kind's tensors are there: fc.weight, norm.weight, lm_head.weight, layers.0",
        ),
        ("pass", "fc.weight", "input width 192 = 3 taps x target width 64"),
    ]
    assert findings_of(report, CheckName.DRAFTER_TAPS)[0] == (
        "pass",
        "eagle_aux_hidden_state_layer_ids",
        "[1, 2, 3], increasing inside the target's 4 layers, in the hidden-state index numbering",
    )
    assert findings_of(report, CheckName.DRAFTER_VOCAB) == [
        (
            "pass",
            "d2t",
            "128 draft ids map to strictly increasing target ids below 256; t2d marks exactly "
            "those",
        )
    ]
    assert findings_of(report, CheckName.PAIRING_EMBEDDING) == [
        ("pass", "embed_tokens.weight", "an identical copy of the target's (65536 bytes)"),
        (
            "info",
            "lm_head.weight",
            "the drafter's own, shaped [128, 64] (target's lm_head.weight: [256, 64])",
        ),
    ]
    [vllm, sglang] = findings_of(report, CheckName.DRAFTER_SERVING)
    assert vllm[2].startswith(
        '--speculative-config \'{"method": "eagle3", "model": "'
        f'{DATA / "eagle3"}", "num_speculative_tokens": 3}}\''
    )
    assert sglang == (
        "info",
        "SGLang",
        f"--speculative-algorithm EAGLE3 --speculative-draft-model-path {DATA / 'eagle3'}",
    )


def test_without_target_the_pairing_is_named_as_not_checked(run_cli) -> None:
    code, report = report_of(run_cli, "inspect", DATA / "eagle3")
    assert code == 0
    assert ("skip", "target", "whether they lie inside the target: needs --target") in (
        findings_of(report, CheckName.DRAFTER_TAPS)
    )
    assert findings_of(report, CheckName.PAIRING) == [
        (
            "skip",
            "target",
            "not checked without --target TARGET: vocabulary, widths, taps, embedding and "
            "head against the target",
        )
    ]


@pytest.mark.parametrize(
    ("case", "failing"),
    [
        (
            "eagle3-no-aux-ids",
            [
                (
                    "drafter-taps",
                    "eagle_aux_hidden_state_layer_ids",
                    "absent: no engine is told which target layers to tap, and each guesses "
                    "(vLLM 0.32, speculators and llama.cpp's converter (0.3.36) each use (2, 2, 1) "
                    "of the target's 4 layers); unless the drafter was trained on exactly those, "
                    "acceptance collapses with nothing in the logs",
                )
            ],
        ),
        (
            "eagle3-no-d2t",
            [
                (
                    "drafter-vocab",
                    "d2t",
                    "draft vocabulary 128 < target vocabulary 256 but no d2t / t2d: vLLM then "
                    "maps draft id i to target id i, and acceptance collapses",
                )
            ],
        ),
        (
            "eagle3-wrong-vocab",
            [
                (
                    "pairing-shape",
                    "vocabulary",
                    "drafter 300, target 256: trained on another vocabulary; engines load it "
                    "and its drafts are garbled",
                )
            ],
        ),
    ],
)
def test_each_defect_fails_with_its_cause(run_cli, case: str, failing: list) -> None:
    code, report = report_of(run_cli, "inspect", DATA / case, "--target", TARGET)
    assert (code, failing_of(report)) == (1, failing)


def test_a_random_embedding_under_a_frozen_flag_fails(run_cli) -> None:
    """speculators' ``embed_requires_grad: false`` says the embedding is the verifier's; this
    drafter's differs in every element: vLLM keeps it, SGLang does not."""
    code, report = report_of(run_cli, "inspect", DATA / "eagle3-random-embed", "--target", TARGET)
    assert code == 1
    [(check, subject, message)] = failing_of(report)
    assert (check, subject) == (CheckName.PAIRING_EMBEDDING, "embed_tokens.weight")
    assert message.startswith("its config says it is the target's, but it differs (bits differ")
    assert message.endswith("vLLM keeps the drafter's own, SGLang takes the target's")


def _copy(case: str, tmp_path: Path) -> Path:
    dest = tmp_path / case
    shutil.copytree(DATA / case, dest)
    return dest


def test_a_flipped_bit_in_d2t_breaks_the_map(run_cli, tmp_path: Path) -> None:
    drafter = _copy("eagle3", tmp_path)
    shard = drafter / "model.safetensors"
    flip_bit(shard, tensor_offset(shard, "d2t") + 8 * 5 + 7, bit=6)  # d2t[5] += 2**62
    code, report = report_of(run_cli, "inspect", drafter)
    assert code == 1
    assert failing_of(report) == [
        ("drafter-vocab", "d2t", "target ids i + d2t[i] not strictly increasing"),
        ("drafter-vocab", "d2t", "target ids i + d2t[i] outside 0..255"),
    ]


def test_a_flipped_mark_in_t2d_breaks_the_count(run_cli, tmp_path: Path) -> None:
    drafter = _copy("eagle3", tmp_path)
    shard = drafter / "model.safetensors"
    offset = tensor_offset(shard, "t2d")
    marks = shard.read_bytes()[offset : offset + 256]
    flip_bit(shard, offset + marks.index(0), bit=0)  # one more target id marked
    code, report = report_of(run_cli, "inspect", drafter)
    assert (code, failing_of(report)) == (
        1,
        [("drafter-vocab", "t2d", "marks 129 target ids, not 128 (d2t)")],
    )


def test_an_unknown_speculators_kind_is_a_skip_that_says_what_was_seen(
    run_cli, tmp_path: Path
) -> None:
    drafter = _copy("eagle3", tmp_path)
    config = json.loads((drafter / "config.json").read_text())
    config["speculators_model_type"] = "eagle9"
    (drafter / "config.json").write_text(json.dumps(config))
    code, report = report_of(run_cli, "inspect", drafter)
    assert code == 0
    assert findings_of(report, CheckName.DRAFTER_KIND) == [
        (
            "skip",
            "kind",
            "a drafter (speculators_model_type 'eagle9') of a kind mtpcheck does not know: its "
            "tensors are not checked against its config",
        )
    ]


QWEN3_NEXT = FIXTURES / "qwen3_next"
MTP = DATA / "mtp-qwen3next"


def test_the_mtp_conversion_is_the_targets_layer_with_its_experts_fused(run_cli) -> None:
    code, report = report_of(run_cli, "inspect", MTP, "--target", QWEN3_NEXT)
    assert code == 0
    assert findings_of(report, CheckName.DRAFTER_MTP) == [
        (
            "pass",
            "mtp layer",
            "29 tensors bit-identical to the target's mtp.layers.0.* (7264 bytes); stored and "
            "never read: verifier_lm_head.weight",
        )
    ]


def test_one_flipped_bit_of_a_fused_expert_is_named_by_its_slice(run_cli, tmp_path) -> None:
    drafter = _copy("mtp-qwen3next", tmp_path)
    shard = drafter / "model.safetensors"
    # expert 2's up_proj: rows 8..15 of gate_up_proj[2] ([4, 16, 16] BF16), its first element
    start = tensor_offset(shard, "mtp_layers.0.mlp.experts.gate_up_proj")
    flip_bit(shard, start + (2 * 16 * 16 + 8 * 16) * 2, bit=1)
    code, report = report_of(run_cli, "diff", QWEN3_NEXT, drafter)
    assert code == 1
    [(check, subject, message)] = failing_of(report)
    assert (check, subject) == (CheckName.DRAFTER_MTP, "mtp_layers.0.mlp.experts.2.up_proj.weight")
    assert message.startswith("bits differ in 1 of 128 elements, first at index [0, 0]")


def test_the_stitched_target_keeps_the_mtp_layer_and_gains_a_nan_head(run_cli) -> None:
    """``speculators stitch-mtp`` wrote the converted layer back into the target bit for bit,
    and added the converter's never-loaded ``verifier_lm_head.weight`` (NaN) beside it:
    the MTP scope passes, the whole checkpoint names the tensor it gained."""
    stitched = DATA / "mtp-qwen3next-stitched"
    code, report = report_of(run_cli, "diff", QWEN3_NEXT, stitched)
    assert code == 0
    assert findings_of(report, CheckName.TENSORS)[0] == (
        "pass",
        "MTP scope",
        "31 of 31 tensors bit-identical (11360 bytes compared equal)",
    )
    code, report = report_of(run_cli, "diff", "--all", QWEN3_NEXT, stitched)
    assert (code, failing_of(report)) == (
        1,
        [("tensors", "verifier_lm_head.weight", "only in B (BF16[64, 16]), absent in A")],
    )


def _edit_config(drafter: Path, **changes: Any) -> None:
    config = json.loads((drafter / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    (drafter / "config.json").write_text(json.dumps(config))


def test_a_flag_without_its_tensor_fails(run_cli, tmp_path: Path) -> None:
    """EAGLE-3.1's ``norm_before_fc`` set on a drafter saved without ``input_norm.weight``."""
    drafter = _copy("eagle3", tmp_path)
    _edit_config(drafter, norm_before_fc=True)
    code, report = report_of(run_cli, "inspect", drafter)
    assert (code, failing_of(report)) == (
        1,
        [
            (
                "drafter-tensors",
                "norm_before_fc",
                "norm_before_fc is set but input_norm.weight is absent: an engine that ignores "
                "the flag skips the norm, and acceptance falls (sglang PR #32334)",
            )
        ],
    )


def test_a_dflash_drafter_without_its_taps_fails(run_cli, tmp_path: Path) -> None:
    drafter = _copy("dflash", tmp_path)
    _edit_config(drafter, aux_hidden_state_layer_ids=None)
    code, report = report_of(run_cli, "inspect", drafter, "--target", TARGET)
    assert code == 1
    [(check, subject, message)] = failing_of(report)
    assert (check, subject) == (CheckName.DRAFTER_TAPS, "aux_hidden_state_layer_ids")
    assert message.startswith("absent: no engine is told which target layers to tap")


def test_taps_past_the_targets_layers_fail(run_cli, tmp_path: Path) -> None:
    drafter = _copy("eagle3", tmp_path)
    _edit_config(drafter, eagle_aux_hidden_state_layer_ids=[1, 3, 5])
    code, report = report_of(run_cli, "inspect", drafter, "--target", TARGET)
    assert (code, failing_of(report)) == (
        1,
        [
            (
                "drafter-taps",
                "eagle_aux_hidden_state_layer_ids",
                "[5] outside the target's 4 layers (read as hidden-state indices: 0 the "
                "embedding, k the output of layer k - 1: 0..4)",
            )
        ],
    )


def test_a_tokenizer_beside_the_drafter_is_held_to_the_targets(run_cli, tmp_path: Path) -> None:
    """vLLM never loads a drafter's tokenizer: one shipped beside it must be the target's."""
    drafter = _copy("eagle3", tmp_path)
    shutil.copy(TARGET / "tokenizer.json", drafter / "tokenizer.json")
    code, report = report_of(run_cli, "inspect", drafter, "--target", TARGET)
    assert code == 0
    assert ("pass", "tokenizer", "the same token table as the target's") in (
        findings_of(report, CheckName.PAIRING_SHAPE)
    )
    tokenizer = json.loads((drafter / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    first, second = list(vocab)[10:12]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # two ids swapped
    (drafter / "tokenizer.json").write_text(json.dumps(tokenizer))
    code, report = report_of(run_cli, "inspect", drafter, "--target", TARGET)
    assert (code, failing_of(report)) == (
        1,
        [
            (
                "pairing-shape",
                "tokenizer",
                "the drafter's tokenizer.json holds another token table than the target's: "
                "vLLM never loads the drafter's, so its drafts name other tokens",
            )
        ],
    )


def test_a_malformed_tokenizer_is_one_line_naming_it(run_cli, tmp_path: Path) -> None:
    drafter = _copy("eagle3", tmp_path)
    (drafter / "tokenizer.json").write_text("{")
    run = run_cli("inspect", drafter, "--target", TARGET)
    assert run.exit_code == 2
    [line] = run.stderr.strip().splitlines()
    assert line.startswith(f"mtpcheck: error: {drafter / 'tokenizer.json'}: not a tokenizer: ")
