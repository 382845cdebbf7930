"""GGUF files as llama.cpp's own converter writes them.

``tests/data/llamacpp_gguf/<run>/`` holds what ``convert_hf_to_gguf.py`` (llama.cpp
``0c1e57098``, vendored in llama-cpp-python 0.3.36, with its gguf-py 0.19.0) wrote from the
shipped fixtures (``tests/thirdparty/llamacpp/``: ``regenerate.sh``, NOTES.md), and in
``dump.json`` what gguf-py's own ``GGUFReader`` reads back from each file. Run names are
``<fixture>__<outtype>__<mode>``: ``full`` (target with its nextn layer), ``no-mtp``
(``--no-mtp``), ``mtp`` (``--mtp``: the separate ``mtp-`` draft file).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mtpcheck import CheckName
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES, flip_bit

CORPUS = Path(__file__).resolve().parent / "data" / "llamacpp_gguf"
SUMMARY = json.loads((CORPUS / "SUMMARY.json").read_text())
WRITTEN = sorted(
    (run["run"], out["file"]) for run in SUMMARY["runs"] if run["ok"] for out in run["outputs"]
)
NEXTN = {"glm4_moe": 2, "qwen3_next": 2, "accept_qwen3_next": 2, "qwen3_5_text": 4}
"""Fixture -> the block llama.cpp writes its nextn layer as (num_hidden_layers)."""


def _gguf(run: str) -> Path:
    (path,) = sorted((CORPUS / run).glob("*.gguf"))
    return path


def _inspect(run_cli, path: Path, code: int = 0) -> dict:
    run = run_cli("inspect", path, "--format", "json")
    assert run.exit_code == code, run
    return json.loads(run.stdout)


@pytest.mark.parametrize(("run", "file"), WRITTEN, ids=[r for r, _ in WRITTEN])
def test_the_reader_reads_what_gguf_py_reads(run: str, file: str) -> None:
    """Every tensor's name, ggml type, shape (outermost first) and absolute offset as
    llama.cpp's own gguf-py reads them; the architecture's counts as its metadata says."""
    files = json.loads((CORPUS / run / "dump.json").read_text())["files"]
    (dumped,) = [f for f in files if f["file"] == file]
    ckpt = open_checkpoint(CORPUS / run / file)  # a shard opens its whole split set
    got = {
        n: (m.dtype, list(m.shape), m.offset, m.nbytes)
        for n, m in ckpt.tensors.items()
        if Path(m.file).name == file
    }
    want = {
        t["name"]: (t["type"], list(reversed(t["shape"])), t["abs_offset"], t["n_bytes"])
        for t in dumped["tensors"]
    }
    assert got == want
    arch = files[0]["architecture"]  # the first shard holds the metadata
    assert ckpt.config["architecture"] == arch
    assert ckpt.config.get("nextn_predict_layers") == ckpt.config.get(
        f"{arch}.nextn_predict_layers"
    )


@pytest.mark.parametrize("outtype", ["f32", "bf16", "q8_0"])
@pytest.mark.parametrize("fixture", sorted(NEXTN))
def test_a_target_with_its_nextn_layer_passes(run_cli, fixture: str, outtype: str) -> None:
    report = _inspect(run_cli, _gguf(f"{fixture}__{outtype}__full"))
    (summary,) = report["inputs"]
    assert (summary["family"], summary["declared_mtp_layers"]) == ("gguf", 1)
    (layer,) = summary["mtp_layers"]
    assert layer["prefix"] == f"blk.{NEXTN[fixture]}." and layer["complete"]
    assert f"blk.{NEXTN[fixture]}.nextn.eh_proj.weight" in layer["tensors"]
    assert report["ok"]


@pytest.mark.parametrize("fixture", sorted(NEXTN))
def test_no_mtp_drops_the_layer_and_its_declaration(run_cli, fixture: str) -> None:
    report = _inspect(run_cli, _gguf(f"{fixture}__bf16__no-mtp"))
    (summary,) = report["inputs"]
    assert summary["declared_mtp_layers"] is None and summary["mtp_layers"] == []
    assert not any(
        ".nextn." in name for name in open_checkpoint(_gguf(f"{fixture}__bf16__no-mtp")).tensors
    )


@pytest.mark.parametrize("fixture", sorted(NEXTN))
def test_the_split_draft_holds_the_targets_nextn_layer_bit_for_bit(run_cli, fixture: str) -> None:
    """``--mtp`` writes the nextn layer into its own ``mtp-`` file: inspect finds it complete,
    and diff with the full target compares the MTP scope bit for bit."""
    draft = _gguf(f"{fixture}__bf16__mtp")
    assert draft.name.startswith("mtp-")
    assert _inspect(run_cli, draft)["ok"]
    run = run_cli("diff", _gguf(f"{fixture}__bf16__full"), draft, "--format", "json")
    assert run.exit_code == 0, run
    tensors = json.loads(run.stdout)["tensors"]
    assert tensors and {t["status"] for t in tensors} == {"equal"}
    assert any(t["name"].startswith(f"blk.{NEXTN[fixture]}.nextn.") for t in tensors)


def test_deepseek_v3_is_converted_without_its_mtp_layer(run_cli) -> None:
    """This llama.cpp converts DeepSeek-V3 without the MTP layer and declares none (its
    ``--mtp`` / ``--no-mtp``: "not supported for DeepseekV3ForCausalLM"): the file alone is
    consistent, and says so."""
    report = _inspect(run_cli, _gguf("deepseek_v3__bf16__full"))
    (summary,) = report["inputs"]
    assert summary["declared_mtp_layers"] is None and summary["mtp_layers"] == []
    names = open_checkpoint(_gguf("deepseek_v3__bf16__full")).tensors
    assert not any(n.startswith("blk.2.") for n in names)
    assert open_checkpoint(FIXTURES / "deepseek_v3").config["num_nextn_predict_layers"] == 1


def test_a_flipped_bit_in_the_nextn_embedding_copy_fails(run_cli, tmp_path: Path) -> None:
    damaged = tmp_path / "glm.gguf"
    shutil.copy(_gguf("glm4_moe__bf16__full"), damaged)
    meta = open_checkpoint(damaged).tensors["blk.2.nextn.embed_tokens.weight"]
    flip_bit(damaged, meta.offset + 6, bit=3)
    report = _inspect(run_cli, damaged, code=1)
    (check,) = [c for c in report["checks"] if c["name"] == CheckName.SHARED_COPIES]
    (bad,) = [f for f in check["findings"] if f["status"] == "fail"]
    assert bad["subject"] == "blk.2.nextn.embed_tokens.weight"
    assert bad["message"].startswith("diverged from token_embd.weight: bits differ in 1 of ")


def test_a_truncated_file_names_what_it_cut(run_cli, tmp_path: Path) -> None:
    src = _gguf("qwen3_next__f32__full")
    damaged = tmp_path / "cut.gguf"
    damaged.write_bytes(src.read_bytes()[:-4096])
    report = _inspect(run_cli, damaged, code=1)
    (check,) = [c for c in report["checks"] if c["name"] == CheckName.INTEGRITY]
    assert check["status"] == "fail"
    assert any("ends before the bytes of" in f["message"] for f in check["findings"])


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda b: b"GGUX" + b[4:], "not a GGUF file (no GGUF magic)"),
        (lambda b: b[:200], "file ends inside the GGUF header (truncated?)"),
        (lambda b: b[:4] + (9).to_bytes(4, "little") + b[8:], "GGUF version 9 is not supported"),
    ],
    ids=["magic", "cut-header", "version"],
)
def test_an_unreadable_header_is_one_line_exit_2(run_cli, tmp_path: Path, edit, reason) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(edit(_gguf("glm4_moe__f32__full").read_bytes()))
    run = run_cli("inspect", bad)
    assert run.exit_code == 2
    assert run.stderr.startswith(f"mtpcheck: error: {bad}: {reason}")
    assert len(run.stderr.strip().splitlines()) == 1
