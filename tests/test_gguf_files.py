"""GGUF inputs of more than one file: split sets (``--split-max-tensors``), a target with the
MTP draft split off from it (``--no-mtp`` + ``--mtp``), and the damage llama.cpp users meet:
a file that declares its nextn layer without holding it.

Split sets and drafts are written by llama.cpp's own converter (``tests/data/llamacpp_gguf``,
``tests/thirdparty/llamacpp/regenerate.sh``); the damaged files are rewritten by gguf-py's own
``GGUFReader`` / ``GGUFWriter``, as its ``gguf_new_metadata.py`` script copies a file.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from mtpcheck import CheckName
from mtpcheck.formats import open_checkpoint
from tests.test_gguf import CORPUS, _gguf
from tests.thirdparty.tools import require

SPLIT = CORPUS / "glm4_moe__bf16__full__split"
SPLIT_DRAFT = CORPUS / "qwen3_next__bf16__mtp__split"


def _report(run_cli, *args: str | Path, code: int = 0) -> dict:
    run = run_cli(*args, "--format", "json")
    assert run.exit_code == code, run
    return json.loads(run.stdout)


def _findings(report: dict, check: str) -> list[dict]:
    return [f for c in report["checks"] if c["name"] == check for f in c["findings"]]


def test_a_split_set_is_one_checkpoint_from_any_shard_or_its_directory() -> None:
    whole = open_checkpoint(_gguf("glm4_moe__bf16__full"))
    shards = sorted(SPLIT.glob("*.gguf"))
    assert len(shards) == 4
    dumped = json.loads((SPLIT / "dump.json").read_text())["files"]
    assert sum(len(f["tensors"]) for f in dumped) == len(whole.tensors)
    for path in (SPLIT, shards[0], shards[2]):
        ckpt = open_checkpoint(path)
        assert {n: (m.dtype, m.shape) for n, m in ckpt.tensors.items()} == {
            n: (m.dtype, m.shape) for n, m in whole.tensors.items()
        }
        assert ckpt.config["nextn_predict_layers"] == 1 and not ckpt.issues
    offsets = {t["name"]: (f["file"], t["abs_offset"]) for f in dumped for t in f["tensors"]}
    ckpt = open_checkpoint(SPLIT)
    assert {n: (Path(m.file).name, m.offset) for n, m in ckpt.tensors.items()} == offsets


def test_a_split_set_diffs_bit_for_bit_with_the_single_file(run_cli) -> None:
    report = _report(run_cli, "diff", _gguf("glm4_moe__bf16__full"), SPLIT, "--all")
    assert report["tensors"] and {t["status"] for t in report["tensors"]} == {"equal"}


def test_a_missing_shard_is_named(run_cli, tmp_path: Path) -> None:
    for shard in sorted(SPLIT.glob("*.gguf"))[:3]:
        shutil.copy(shard, tmp_path)
    report = _report(run_cli, "inspect", tmp_path, code=1)
    (missing,) = [f for f in _findings(report, CheckName.INTEGRITY) if f["status"] == "fail"]
    assert missing["subject"] == "Glm4_Moe-4x10K-BF16-00004-of-00004.gguf"
    assert missing["message"].endswith("of the split set is missing")


@pytest.mark.parametrize("draft", ["single", "split"])
def test_a_target_and_its_draft_pass_together(run_cli, tmp_path: Path, draft: str) -> None:
    target = _gguf("qwen3_next__bf16__no-mtp")
    if draft == "single":
        draft_path = _gguf("qwen3_next__bf16__mtp")
    else:
        draft_path = sorted(SPLIT_DRAFT.glob("*.gguf"))[0]
    report = _report(run_cli, "inspect", target, "--draft", draft_path)
    (summary,) = report["inputs"]
    (layer,) = summary["mtp_layers"]
    assert (layer["prefix"], layer["complete"]) == ("blk.2.", True)
    assert report["ok"]
    shutil.copy(target, tmp_path)  # a directory holding both is the same pair
    for part in [draft_path] if draft == "single" else sorted(SPLIT_DRAFT.glob("*.gguf")):
        shutil.copy(part, tmp_path)
    assert _report(run_cli, "inspect", tmp_path)["inputs"][0]["mtp_layers"] == [layer]


def test_the_target_alone_says_where_its_draft_is_expected(run_cli, tmp_path: Path) -> None:
    target = _gguf("glm4_moe__bf16__no-mtp")
    alone = _findings(_report(run_cli, "inspect", target), CheckName.MTP_COUNT)
    (note,) = [f for f in alone if f["subject"] == "draft"]
    assert note["message"].endswith(
        "writes a split-off MTP head to mtp-<name>.gguf, and none is beside it"
    )
    shutil.copy(target, tmp_path)
    shutil.copy(_gguf("glm4_moe__bf16__mtp"), tmp_path)
    beside = _findings(_report(run_cli, "inspect", tmp_path / target.name), CheckName.MTP_COUNT)
    (note,) = [f for f in beside if f["subject"] == "draft"]
    assert "mtp-Glm4_Moe-BF16.gguf beside it: check the pair with --draft" in note["message"]


def test_a_draft_of_another_model_does_not_fit(run_cli) -> None:
    report = _report(
        run_cli,
        "inspect",
        _gguf("qwen3_next__bf16__no-mtp"),
        "--draft",
        _gguf("glm4_moe__bf16__mtp"),
        code=1,
    )
    messages = [
        f["message"] for f in _findings(report, CheckName.INTEGRITY) if f["status"] == "fail"
    ]
    assert (
        "the draft mtp-Glm4_Moe-BF16.gguf: architecture 'glm4moe', the target's is 'qwen3next'"
        in messages
    )


def test_draft_needs_a_target_without_its_nextn_layer(run_cli) -> None:
    full = _gguf("qwen3_next__bf16__full")
    run = run_cli("inspect", full, "--draft", _gguf("qwen3_next__bf16__mtp"))
    assert run.exit_code == 2
    assert run.stderr.strip() == (
        f"mtpcheck: error: {full}: already holds its nextn layer; "
        "--draft is for a target written --no-mtp"
    )


def _rewrite(src: Path, dst: Path, keys: dict, keep: Callable[[str], bool]) -> None:
    """Copy ``src`` to ``dst`` with gguf-py: ``keys`` set (name -> (value, GGUFValueType)),
    only the tensors ``keep`` accepts."""
    require("gguf")
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        value, kind = keys.pop(field.name, (field.contents(), kind))
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    for name, (value, kind) in keys.items():
        writer.add_key_value(name, value, kind)
    tensors = [t for t in reader.tensors if keep(t.name)]
    for t in tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        writer.write_tensor_data(t.data)
    writer.close()


def test_no_mtp_output_that_still_declares_its_nextn_layer_fails(run_cli, tmp_path: Path) -> None:
    """The declaration kept after the layer went (``--no-mtp`` output with
    ``glm4moe.nextn_predict_layers`` and the block count of the full file)."""
    require("gguf")
    import gguf

    uint32 = gguf.GGUFValueType.UINT32
    damaged = tmp_path / "glm.gguf"
    keys = {"glm4moe.nextn_predict_layers": (1, uint32), "glm4moe.block_count": (3, uint32)}
    _rewrite(_gguf("glm4_moe__bf16__no-mtp"), damaged, keys, lambda _: True)
    assert open_checkpoint(damaged).config["glm4moe.nextn_predict_layers"] == 1
    report = _report(run_cli, "inspect", damaged, code=1)
    (count,) = _findings(report, CheckName.MTP_COUNT)
    assert count["status"] == "fail"
    assert count["message"] == (
        "config declares 1 MTP layer(s) (nextn_predict_layers) but the checkpoint holds no "
        "MTP weights"
    )


def test_a_file_that_lost_its_nextn_tensors_names_them(run_cli, tmp_path: Path) -> None:
    """llama.cpp PR 16359's loss: the nextn tensors gone, the block and the key kept."""
    damaged = tmp_path / "glm.gguf"
    _rewrite(_gguf("glm4_moe__bf16__full"), damaged, {}, lambda n: ".nextn." not in n)
    report = _report(run_cli, "inspect", damaged, code=1)
    failed = [f for f in _findings(report, CheckName.MTP_LAYERS) if f["status"] == "fail"]
    assert failed and "blk.2.nextn.eh_proj.weight" in failed[0]["message"]


@pytest.mark.parametrize(
    ("lost", "subject", "message"),
    [
        (
            "blk.0.",
            "main layer 0 (dense)",
            "all its tensors missing (no tensor of this layer in the checkpoint)",
        ),
        ("output_norm.weight", "output_norm.weight", "missing: the final norm of the main model"),
        (
            "blk.1.ffn_down_exps.weight",
            "main layer 1 (moe)",
            "1 tensor(s) of its ffn missing (as the MTP block blk.2. mirroring it holds them): "
            "ffn_down_exps.weight",
        ),
    ],
)
def test_a_file_that_lost_main_weights_names_them(
    run_cli, tmp_path: Path, lost: str, subject: str, message: str
) -> None:
    """A main block, the final norm or a layer's stacked experts left out of a copy that
    gguf-py's own writer made: the main model is short of what its metadata declares (the one
    MoE main layer is held to the nextn block that mirrors it)."""
    damaged = tmp_path / "glm.gguf"
    _rewrite(_gguf("glm4_moe__bf16__full"), damaged, {}, lambda n: not n.startswith(lost))
    report = _report(run_cli, "inspect", damaged, code=1)
    failed = [(f["subject"], f["message"]) for f in _findings(report, CheckName.MAIN_MODEL)]
    assert failed == [(subject, message)]
