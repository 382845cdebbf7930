"""Every damaged input through every command: the gate holds on damaged sources.

Each case damages a copy of a shipped fixture for real (the ``safetensors`` library rewriting
a shard, ``os.truncate``, a flipped bit, an edited config) and runs it through ``inspect``,
``diff ORIGINAL CASE`` (MTP scope and ``--all``), ``roundtrip`` and ``convert
hf-to-megatron``. What each command must say:

* ``inspect`` and ``diff``: the exit code and the first failing finding, given per case;
* ``roundtrip``: for a source that fails ``inspect``, exactly ``inspect``'s failing checks,
  named ``source-*``, and no conversion (nothing is blamed on a stage); otherwise what
  ``inspect`` says;
* ``convert hf-to-megatron``: refused with ``inspect``'s first failing finding (exit 1), or
  the same one-line error (exit 2), and no file left behind; a source that passes is written;
* no command exits 3 or prints a traceback, and none writes into the checkpoint it reads.

The same holds for damaged Megatron checkpoints (written by megatron-core's own
``dist_checkpointing`` through the built-in converter) under ``inspect``, ``diff`` and
``convert megatron-to-hf``, and for ``accept`` on damaged copies of a trained fixture.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.errors import one_line
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES, Run, flip_bit

INDEX = "model.safetensors.index.json"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
MTP = "model.layers.2."
"""The MTP layer's prefix in the DeepSeek-V3 and GLM-4.5 fixtures (2 main layers + 1)."""


# --- damage, done for real -------------------------------------------------------------------


Damage = Callable[[Path], Path | None]
"""Damages a checkpoint copy in place; returns the file an exit-2 error must name."""


def _file_of(root: Path, name: str) -> Path:
    return Path(open_checkpoint(root).tensors[name].file)


def _rewrite(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Load one safetensors file with the safetensors library, edit it, save it back."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata=metadata)


def _drop(*prefixes: str, index: bool = True) -> Damage:
    """Remove the tensors whose names start with ``prefixes`` from their shards, and from the
    index too unless ``index`` is False (a stale index)."""

    def damage(root: Path) -> None:
        names = [n for n in open_checkpoint(root).tensors if n.startswith(prefixes)]
        assert names, prefixes
        for shard in {_file_of(root, n) for n in names}:
            _rewrite(shard, lambda t: [t.pop(n) for n in names if n in t])
        if index and (root / INDEX).exists():
            content = json.loads((root / INDEX).read_text())
            for n in names:
                del content["weight_map"][n]
            (root / INDEX).write_text(json.dumps(content))

    return damage


def _truncate(name: str, keep: int) -> Damage:
    """Truncate the file holding tensor ``name``: to ``keep`` bytes, or by ``-keep``."""

    def damage(root: Path) -> Path:
        path = _file_of(root, name)
        os.truncate(path, keep if keep >= 0 else path.stat().st_size + keep)
        return path

    return damage


def _flip(name: str, element: int = 3) -> Damage:
    def damage(root: Path) -> None:
        meta = open_checkpoint(root).tensors[name]
        width = meta.nbytes // meta.numel
        flip_bit(Path(meta.file), meta.offset + element * width, bit=1)

    return damage


def _config(**changes: Any) -> Damage:
    def damage(root: Path) -> None:
        config = json.loads((root / "config.json").read_text())
        config.update(changes)
        (root / "config.json").write_text(json.dumps(config))

    return damage


def _corrupt_header(name: str) -> Damage:
    """Overwrite the first byte of the JSON header of the file holding ``name``."""

    def damage(root: Path) -> Path:
        path = _file_of(root, name)
        with open(path, "r+b") as f:
            f.seek(8)
            f.write(b"#")
        return path

    return damage


def _transpose(name: str) -> Damage:
    def damage(root: Path) -> None:
        def edit(tensors: dict[str, Any]) -> None:
            tensors[name] = tensors[name].t().contiguous()

        _rewrite(_file_of(root, name), edit)

    return damage


def _copy_into_other_shard(name: str) -> Damage:
    """Store tensor ``name`` in the other shard as well (the index keeps one of them)."""

    def damage(root: Path) -> None:
        from safetensors.torch import load_file

        home = _file_of(root, name)
        other = root / (SHARD2 if home.name == SHARD1 else SHARD1)
        tensor = load_file(str(home))[name]
        _rewrite(other, lambda t: t.update({name: tensor}))

    return damage


# --- the cases -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expect:
    exit_code: int
    first: str
    """Regex searched in the first failing finding, ``check: subject: message`` (exit 1), or
    in the one-line error's reason (exit 2); empty: nothing fails (exit 0)."""


PASSES = Expect(0, "")


@dataclass(frozen=True)
class Case:
    name: str
    fixture: str
    damage: Damage
    inspect: Expect
    diff: Expect
    diff_all: Expect | None = None
    """``diff --all``; default: as ``diff``."""
    main_model: str = ""
    """Regex of the first failing finding of the source's mcore-model check (which
    ``inspect`` does not run), for damage to the main model that a conversion cannot carry."""


def _unreadable(reason: str) -> tuple[Expect, Expect]:
    return Expect(2, reason), Expect(2, reason)


CASES = [
    Case(
        "truncated-by-a-few-bytes",
        "deepseek_v3",
        _truncate(f"{MTP}shared_head.norm.weight", -100),
        Expect(
            1,
            rf"^integrity: {SHARD2}: {SHARD2} is truncated: header declares 13752 data bytes, "
            rf"the file holds 13652 \(3 tensors cut off: {MTP}shared_head\.head\.weight, ",
        ),
        Expect(1, rf"^integrity: B: {SHARD2}: {SHARD2} is truncated"),
    ),
    Case(
        "truncated-to-zero",
        "deepseek_v3",
        _truncate(f"{MTP}shared_head.norm.weight", 0),
        *_unreadable(r"^file is 0 bytes, too short for a safetensors header"),
    ),
    Case(
        "missing-shard",
        "deepseek_v3",
        lambda root: (root / SHARD1).unlink(),
        Expect(
            1,
            rf"^integrity: {SHARD1}: index names shard {SHARD1} \(39 tensors\) but the file "
            "is missing",
        ),
        Expect(1, rf"^integrity: B: {SHARD1}: index names shard {SHARD1} \(39 tensors\)"),
    ),
    Case(
        "stale-index",
        "deepseek_v3",
        _drop(f"{MTP}enorm.weight", index=False),
        Expect(
            1,
            rf"^integrity: {MTP}enorm\.weight: index places {MTP}enorm\.weight in {SHARD2}, "
            "which lacks it",
        ),
        Expect(1, rf"^integrity: B: {MTP}enorm\.weight: index places {MTP}enorm\.weight in"),
    ),
    Case(
        "mtp-norm-missing",
        "deepseek_v3",
        _drop(f"{MTP}enorm.weight"),
        Expect(
            1,
            r"^mtp-count: mtp-count: config declares 1 \(num_nextn_predict_layers\); "
            rf"1 present, 0 complete \(mtp layer 0 lacks {MTP}enorm\.weight\)$",
        ),
        Expect(1, rf"^tensors: {MTP}enorm\.weight: missing in B \(was BF16\[16\]\)"),
    ),
    Case(
        "mtp-half-its-experts-missing",
        "glm4_moe",
        _drop(f"{MTP}mlp.experts.0.", f"{MTP}mlp.experts.1."),
        Expect(
            1,
            r"^mtp-count: mtp-count: config declares 1 .*; 1 present, 0 complete "
            rf"\(mtp layer 0 lacks {MTP}mlp\.experts\.0\.down_proj\.weight, ",
        ),
        Expect(1, rf"^tensors: {MTP}mlp\.experts\.0\.down_proj\.weight: missing in B"),
    ),
    Case(
        "mtp-projection-missing",
        "deepseek_v3",
        _drop(f"{MTP}eh_proj.weight"),
        Expect(
            1,
            r"^mtp-count: mtp-count: config declares 1 .*; 1 present, 0 complete "
            rf"\(mtp layer 0 lacks {MTP}eh_proj\.weight\)$",
        ),
        Expect(1, rf"^tensors: {MTP}eh_proj\.weight: missing in B \(was BF16\[16, 32\]\)"),
    ),
    Case(
        "mtp-layer-gone-count-kept",
        "glm4_moe",
        _drop(MTP),
        Expect(
            1,
            r"^mtp-count: mtp-count: config declares 1 MTP layer\(s\) "
            r"\(num_nextn_predict_layers\) but the checkpoint holds no MTP weights",
        ),
        Expect(1, rf"^tensors: {MTP}eh_proj\.weight: missing in B"),
    ),
    Case(
        "bit-flip-in-an-mtp-copy",
        "deepseek_v3",
        _flip(f"{MTP}embed_tokens.weight"),
        Expect(
            1,
            rf"^shared-copies: {MTP}embed_tokens\.weight: diverged from "
            r"model\.embed_tokens\.weight: bits differ in 1 of 1024 elements, first at index "
            r"\[0, 3\]",
        ),
        Expect(1, rf"^tensors: {MTP}embed_tokens\.weight: bits differ in 1 of 1024"),
    ),
    Case(
        "bit-flip-in-the-main-head",
        "deepseek_v3",
        _flip("lm_head.weight"),
        Expect(1, rf"^shared-copies: {MTP}shared_head\.head\.weight: diverged from lm_head"),
        Expect(1, r"^tensors: lm_head\.weight: bits differ in 1 of 1024 elements"),
    ),
    Case(
        # outside the MTP scope: nothing in one checkpoint can show it; diff --all does
        "bit-flip-in-a-main-layer",
        "deepseek_v3",
        _flip("model.layers.0.mlp.gate_proj.weight"),
        PASSES,
        PASSES,
        Expect(1, r"^tensors: model\.layers\.0\.mlp\.gate_proj\.weight: bits differ in 1 of"),
    ),
    Case(
        "main-layer-expert-missing",
        "deepseek_v3",
        _drop("model.layers.1.mlp.experts.2.down_proj.weight"),
        Expect(1, r"^main-model: main layer 1 \(moe\): expert 2 of 4 lacks down_proj\.weight$"),
        Expect(1, r"^main-model: B: main layer 1 \(moe\): expert 2 of 4 lacks down_proj\.weight$"),
    ),
    Case(
        "main-layer-norm-missing",
        "glm4_moe",
        _drop("model.layers.0.input_layernorm.weight"),
        Expect(
            1,
            r"^main-model: main layer 0 \(dense\): 1 tensor\(s\) its definition holds missing "
            r"\(transformers [\d.]+'s Glm4MoeForCausalLM builds a layer of this kind with them\): "
            r"model\.layers\.0\.input_layernorm\.weight$",
        ),
        Expect(
            1,
            r"^main-model: B: main layer 0 \(dense\): 1 tensor\(s\) its definition holds "
            r"missing .*: model\.layers\.0\.input_layernorm\.weight$",
        ),
    ),
    Case(
        "main-head-missing",
        "glm4_moe",
        _drop("lm_head.weight"),
        Expect(
            1,
            r"^main-model: lm_head\.weight: missing: the output head \(the config does not "
            r"tie it\) of the main model$",
        ),
        Expect(1, r"^main-model: B: lm_head\.weight: missing: the output head"),
    ),
    Case(
        "count-above-the-tensors",
        "deepseek_v3",
        _config(num_nextn_predict_layers=2),
        Expect(
            1,
            r"^mtp-count: mtp-count: config declares 2 \(num_nextn_predict_layers\); "
            "1 present, 1 complete",
        ),
        Expect(1, r"^config: num_nextn_predict_layers: 1 -> 2"),
    ),
    Case(
        "count-below-the-tensors",
        "deepseek_v3",
        _config(num_nextn_predict_layers=0),
        Expect(
            1,
            r"^mtp-count: mtp-count: 1 MTP layer\(s\) present but config declares 0 "
            r"\(num_nextn_predict_layers\)",
        ),
        Expect(1, r"^config: num_nextn_predict_layers: 1 -> 0"),
    ),
    Case(
        "corrupt-header",
        "deepseek_v3",
        _corrupt_header(f"{MTP}enorm.weight"),
        *_unreadable(r"^header is not valid JSON"),
    ),
    Case(
        "transposed-mtp-projection",
        "deepseek_v3",
        _transpose(f"{MTP}eh_proj.weight"),
        Expect(
            1,
            rf"^mtp-shapes: {MTP}eh_proj\.weight: shape \[32, 16\], expected \[16, 32\] "
            r"\(\[hidden_size, 2 \* hidden_size\] with hidden_size 16\)",
        ),
        Expect(1, rf"^tensors: {MTP}eh_proj\.weight: shape changed \[16, 32\] -> \[32, 16\]"),
    ),
    Case(
        "transposed-mtp-block-tensor",
        "glm4_moe",
        _transpose(f"{MTP}mlp.shared_experts.down_proj.weight"),
        Expect(
            1,
            rf"^mtp-shapes: {MTP}mlp\.shared_experts\.down_proj\.weight: shape \[8, 16\], "
            r"expected \[16, 8\] \(as model\.layers\.1\.mlp\.shared_experts\.down_proj\.weight,"
            " the main-layer tensor it mirrors\\)",
        ),
        Expect(1, rf"^tensors: {MTP}mlp\.shared_experts\.down_proj\.weight: shape changed"),
    ),
    Case(
        "tensor-in-two-shards",
        "deepseek_v3",
        _copy_into_other_shard("model.embed_tokens.weight"),
        Expect(
            1,
            rf"^integrity: model\.embed_tokens\.weight: model\.embed_tokens\.weight is stored "
            rf"in {SHARD1} and {SHARD2}",
        ),
        Expect(1, r"^integrity: B: model\.embed_tokens\.weight: model\.embed_tokens\.weight is"),
    ),
]


def test_the_matrix_covers_what_the_gate_must_hold_on() -> None:
    assert len({c.name for c in CASES}) == len(CASES) >= 15
    assert {c.inspect.exit_code for c in CASES} == {0, 1, 2}


# --- running a case ---------------------------------------------------------------------------


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _first_failure(report: dict[str, Any], short: bool = False) -> str:
    """``check: subject: message`` of the first failing finding ("" if none); ``short``
    leaves out a subject that repeats the check's name, as a refusal's one line does."""
    for check in report["checks"]:
        for f in check["findings"]:
            if f["status"] == "fail":
                subject = "" if short and f["subject"] == check["name"] else f"{f['subject']}: "
                return f"{check['name']}: {subject}{f['message']}"
    return ""


def _failing_checks(report: dict[str, Any]) -> list[str]:
    return [c["name"] for c in report["checks"] if c["status"] == "fail"]


def _clean(run: Run) -> None:
    assert run.exit_code != 3, run
    assert "Traceback" not in run.stdout + run.stderr, run
    assert "internal error" not in run.stderr, run


def _error_reason(run: Run, culprit: Path, verb: str = "error") -> str:
    """The reason of a one-line error that names ``culprit``."""
    prefix = f"mtpcheck: {verb}: {one_line(str(culprit))}: "
    assert run.stderr.count("\n") == 1 and run.stderr.startswith(prefix), run
    return run.stderr[len(prefix) : -1]


def _assert_report(run: Run, expect: Expect) -> dict[str, Any] | None:
    """Check a report command against ``expect``; returns its report (None for exit 2)."""
    _clean(run)
    assert run.exit_code == expect.exit_code, run
    if expect.exit_code == 2:
        return None
    report = json.loads(run.stdout)
    first = _first_failure(report)
    if expect.exit_code == 0:
        assert first == "", first
    else:
        assert re.search(expect.first, first), (expect.first, first)
    return report


def _nothing_left(parent: Path, dst: Path) -> None:
    assert not dst.exists(), f"{dst} was left behind"
    assert [p.name for p in parent.iterdir() if ".partial-" in p.name] == []


@pytest.fixture
def damaged(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[Case, Path, Path]]:
    """(case, damaged copy, the file an exit-2 error names) with the copy's bytes checked
    unchanged once the test is done."""
    case: Case = request.param
    root = Path(shutil.copytree(FIXTURES / case.fixture, tmp_path / case.fixture))
    culprit = case.damage(root) or root
    before = _digest(root)
    yield case, root, culprit
    assert _digest(root) == before, "a command wrote into the checkpoint it was asked to check"


@pytest.mark.parametrize("damaged", CASES, ids=[c.name for c in CASES], indirect=True)
def test_every_command_on_a_damaged_hf_source(
    damaged: tuple[Case, Path, Path], tmp_path: Path, run_cli: Callable[..., Run]
) -> None:
    case, root, culprit = damaged
    original = FIXTURES / case.fixture
    json_ = ("--format", "json")

    # inspect and diff: the exit code and the first failing finding
    inspected = run_cli("inspect", root, *json_)
    report = _assert_report(inspected, case.inspect)
    _assert_report(run_cli("diff", original, root, *json_), case.diff)
    _assert_report(run_cli("diff", original, root, "--all", *json_), case.diff_all or case.diff)

    # roundtrip: the source's own defects, named as the source's, and nothing converted
    work = tmp_path / "work"
    tripped = run_cli("roundtrip", root, "--workdir", work, *json_)
    _clean(tripped)
    damaged = 1 if case.main_model else case.inspect.exit_code
    assert tripped.exit_code == damaged, tripped
    if report is not None and damaged == 1:
        trip = json.loads(tripped.stdout)
        failing = _failing_checks(trip)
        inspects = [f"source-{c}" for c in _failing_checks(report)]
        assert failing[: len(inspects)] == inspects
        assert failing[len(inspects) :] == (["source-mcore-model"] if case.main_model else [])
        if case.main_model:
            (main,) = [c for c in trip["checks"] if c["name"] == CheckName.SOURCE_MCORE_MODEL]
            first = next(f for f in main["findings"] if f["status"] == "fail")
            assert re.search(case.main_model, f"{first['subject']}: {first['message']}")
        else:
            assert _first_failure(trip) == "source-" + _first_failure(report)
        (stage1,) = [c for c in trip["checks"] if c["name"] == CheckName.STAGE1_CONVERT]
        # inspect's 9 checks on the source, and mcore-model where they pass
        assert stage1["status"] == "skip"
        assert len(trip["checks"]) == (11 if case.main_model else 10)
        assert len(trip["inputs"]) == 1
    assert list(work.iterdir()) == []

    # convert: refused with inspect's first finding, or the same one-line error; nothing left
    dst = tmp_path / "out" / "megatron"
    converted = run_cli("convert", "hf-to-megatron", root, dst)
    _clean(converted)
    assert converted.exit_code == damaged, converted
    if case.inspect.exit_code == 2:
        assert re.search(case.inspect.first, _error_reason(converted, culprit))
        assert _error_reason(inspected, culprit) == _error_reason(converted, culprit)
    if case.inspect.exit_code == 1:
        assert report is not None
        reason = _error_reason(converted, root, verb="refused")
        first = _first_failure(report, short=True)
        assert reason.startswith(f"not converted: the source fails its audit: {first}"), reason
    elif case.main_model:
        reason = _error_reason(converted, root, verb="refused")
        assert reason.startswith("not converted: the source is not whole: mcore-model: "), reason
        assert re.search(case.main_model, reason.split(": mcore-model: ", 1)[1]), reason
    if damaged == 0:
        assert (dst / "release" / "metadata.json").is_file()
    else:
        _nothing_left(tmp_path, tmp_path / "out")


# --- Megatron sources: written by megatron-core's dist_checkpointing, then damaged -------------

DS = FIXTURES / "deepseek_v3"
MTP_MG = "mtp.layers.0."


@pytest.fixture(scope="module")
def megatron_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """torch_dist saves of the DeepSeek-V3 fixture (``good``) and of a copy without its MTP
    layer that declares none (``no-mtp``), by the built-in converter (megatron-core's own
    ``dist_checkpointing.save``)."""
    from mtpcheck.convert.builtin import hf_to_megatron

    root = tmp_path_factory.mktemp("megatron")
    stripped = Path(shutil.copytree(DS, root / "hf-no-mtp"))
    _drop(MTP)(stripped)
    _config(num_nextn_predict_layers=0)(stripped)
    return {
        "good": hf_to_megatron(open_checkpoint(DS), root / "good").parent,
        "no-mtp": hf_to_megatron(open_checkpoint(stripped), root / "no-mtp").parent,
    }


def _distcp(root: Path) -> Path:
    (data,) = (root / "release").glob("*.distcp")
    return data


def _mg_truncate(root: Path) -> Path:
    os.truncate(_distcp(root), _distcp(root).stat().st_size - 1)
    return _distcp(root)


def _mg_unlink(root: Path) -> Path:
    path = _distcp(root)
    path.unlink()
    return path


def _mg_metadata_garbage(root: Path) -> Path:
    path = root / "release" / ".metadata"
    path.write_bytes(b"this is not a pickle")
    return path


def _mg_forget(name: str, prefix: bool = False) -> Damage:
    """Drop tensor ``name`` (with ``prefix``: every entry starting so) from the checkpoint's
    ``.metadata``, as a save that skipped it: torch DCP's own Metadata object, unpickled and
    pickled again (we wrote this file)."""

    def damage(root: Path) -> None:
        import pickle

        path = root / "release" / ".metadata"
        with open(path, "rb") as f:
            metadata = pickle.load(f)
        keys = [k for k in metadata.state_dict_metadata if k.startswith(name)] if prefix else [name]
        assert keys, name
        for key in keys:
            del metadata.state_dict_metadata[key]
        with open(path, "wb") as f:
            pickle.dump(metadata, f)

    return damage


def _mg_flip(name: str) -> Damage:
    def damage(root: Path) -> None:
        ckpt = open_checkpoint(root)
        (span, *_) = ckpt.byte_spans(name)
        flip_bit(Path(span.file), span.offset + 2, bit=1)

    return damage


@dataclass(frozen=True)
class MegatronCase:
    name: str
    damage: Damage
    inspect: Expect
    diff: Expect
    export: Expect
    """``convert megatron-to-hf``: exit 1 regex of the refusal's reason; 0: written."""
    source: str = "good"
    hf_config: Path = DS / "config.json"


MEGATRON_CASES = [
    MegatronCase(
        "distcp-truncated",
        _mg_truncate,
        Expect(1, r"^integrity: __0_0\.distcp: __0_0\.distcp is \d+ bytes, but chunks of"),
        Expect(1, r"^integrity: B: __0_0\.distcp: __0_0\.distcp is \d+ bytes"),
        Expect(1, r"^not converted: the source fails its audit: integrity: __0_0\.distcp: "),
    ),
    MegatronCase(
        "distcp-missing",
        _mg_unlink,
        *[Expect(2, r"named in \.metadata, but the file is missing")] * 3,
    ),
    MegatronCase(
        "metadata-not-a-pickle",
        _mg_metadata_garbage,
        *[Expect(2, r"unreadable pickle \(unknown opcode 0x20 at byte 4\)")] * 3,
    ),
    MegatronCase(
        "mtp-tensor-left-out-of-the-save",
        _mg_forget(f"{MTP_MG}enorm.weight"),
        Expect(
            1,
            r"^mtp-count: mtp-count: config declares 1 \(mtp_num_layers\); 1 present, "
            rf"0 complete \(mtp layer 0 lacks {MTP_MG}enorm\.weight\)$",
        ),
        Expect(1, rf"^tensors: {MTP_MG}enorm\.weight: missing in B \(was BF16\[16\]\)"),
        Expect(1, r"^not converted: the source fails its audit: mtp-count: config declares 1"),
    ),
    MegatronCase(
        "main-layer-left-out-of-the-save",
        _mg_forget("decoder.layers.0.", prefix=True),
        Expect(1, r"^main-model: main layer 0 \(dense\): all its tensors missing \(no tensor of"),
        Expect(1, r"^main-model: B: main layer 0 \(dense\): all its tensors missing"),
        Expect(
            1,
            r"^not converted: the source fails its audit: main-model: main layer 0 \(dense\): "
            r"all its tensors missing",
        ),
    ),
    MegatronCase(
        "final-norm-left-out-of-the-save",
        _mg_forget("decoder.final_layernorm.weight"),
        Expect(
            1,
            r"^main-model: decoder\.final_layernorm\.weight: missing: the final norm of the "
            r"main model$",
        ),
        Expect(1, r"^main-model: B: decoder\.final_layernorm\.weight: missing"),
        Expect(1, r"^not converted: the source fails its audit: main-model: decoder\."),
    ),
    MegatronCase(
        # nothing in the Megatron checkpoint can show it; diff against the source does, and
        # the export carries it faithfully (diff of the export finds it again, below)
        "bit-flip-in-an-mtp-tensor",
        _mg_flip(f"{MTP_MG}eh_proj.weight"),
        PASSES,
        Expect(1, rf"^tensors: {MTP_MG}eh_proj\.weight: bits differ in 1 of 512 elements"),
        PASSES,
    ),
    MegatronCase(
        "hf-config-declares-mtp-the-checkpoint-lacks",
        lambda root: None,
        PASSES,
        Expect(1, r"^config: mtp_num_layers: 1 -> None"),  # megatron-core's "MTP off"
        Expect(
            1,
            r"^not converted: the HF checkpoint it would write does not back the config it "
            r"would carry: mtp-count: config declares 1 MTP layer\(s\) "
            r"\(num_nextn_predict_layers\) but the checkpoint holds no MTP weights",
        ),
        source="no-mtp",
    ),
]


@pytest.mark.parametrize("case", MEGATRON_CASES, ids=[c.name for c in MEGATRON_CASES])
def test_every_command_on_a_damaged_megatron_source(
    case: MegatronCase,
    megatron_checkpoints: dict[str, Path],
    tmp_path: Path,
    run_cli: Callable[..., Run],
) -> None:
    root = Path(shutil.copytree(megatron_checkpoints[case.source], tmp_path / "megatron"))
    culprit = case.damage(root) or root
    before = _digest(root)
    json_ = ("--format", "json")
    inspected = run_cli("inspect", root, *json_)
    _assert_report(inspected, case.inspect)
    _assert_report(run_cli("diff", DS, root, *json_), case.diff)

    dst = tmp_path / "out" / "hf"
    exported = run_cli("convert", "megatron-to-hf", root, dst, "--hf-config", case.hf_config)
    _clean(exported)
    assert exported.exit_code == case.export.exit_code, exported
    if case.export.exit_code == 2:
        assert _error_reason(exported, culprit) == _error_reason(inspected, culprit)
        assert re.search(case.export.first, _error_reason(exported, culprit))
    elif case.export.exit_code == 1:
        assert re.search(case.export.first, _error_reason(exported, root, verb="refused"))
    if case.export.exit_code:
        _nothing_left(tmp_path, tmp_path / "out")
    else:
        diffed = run_cli("diff", DS, dst, *json_)
        _assert_report(diffed, Expect(1, rf"^tensors: {MTP}eh_proj\.weight: bits differ in 1 of"))
    assert _digest(root) == before, "a command wrote into the checkpoint it was asked to check"


# --- accept: a damaged copy of a trained fixture ------------------------------------------------

ACCEPT = FIXTURES / "accept_deepseek_v3"


@pytest.mark.parametrize(
    ("damage", "exit_code", "message"),
    [
        pytest.param(
            _truncate(f"{MTP}shared_head.norm.weight", -100),
            1,
            r"^mtpcheck: refused: .*: not measured: model\.safetensors: model\.safetensors is "
            rf"truncated: .* \(2 tensors cut off: {MTP}shared_head\.norm\.weight, ",
            id="truncated",
        ),
        pytest.param(
            _corrupt_header(f"{MTP}enorm.weight"),
            2,
            r"^mtpcheck: error: .*model\.safetensors: header is not valid JSON",
            id="corrupt-header",
        ),
        pytest.param(
            _drop(f"{MTP}enorm.weight"),
            1,
            rf"^acceptance/in_domain: .*: no drafter \(MTP layer 0 is incomplete: 1 tensor\(s\) "
            rf"missing \({MTP}enorm\.weight\)\)",
            id="mtp-norm-missing",
        ),
    ],
)
def test_accept_on_a_damaged_checkpoint(
    damage: Damage, exit_code: int, message: str, tmp_path: Path, run_cli: Callable[..., Run]
) -> None:
    """A checkpoint that cannot be loaded whole is refused before a model is loaded; an
    incomplete MTP layer is measured as no drafter, a finding."""
    root = Path(shutil.copytree(ACCEPT, tmp_path / "ckpt"))
    damage(root)
    workload = f"in_domain={root / 'workloads' / 'in_domain.jsonl'}"
    run = run_cli("accept", root, "--workload", workload, "--max-tokens", "24", "--format", "json")
    _clean(run)
    assert run.exit_code == exit_code, run
    if run.stdout.startswith("{") and "checks" in json.loads(run.stdout):
        assert re.search(message, _first_failure(json.loads(run.stdout))), run
    else:
        assert run.stderr.count("\n") == 1 and re.search(message, run.stderr), run
