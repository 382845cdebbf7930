"""Pickles crafted opcode by opcode to steer, crash or exhaust the torch-free readers.

Each is refused with one line naming the file (exit 2), and none changes how the same process
reads another file: unpickling applies state to whatever a file names (pickle's BUILD), so a
reader that handed out a shared class or function would let one file decide the verdict on the
next. The steering attack that motivated this read tensor chunks from outside a checkpoint with
a PASS, once ``pathlib.PurePosixPath`` had been told it was never absolute.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from mtpcheck.errors import InputError
from mtpcheck.formats.safe_pickle import load_raw_pickle, load_torch_file
from mtpcheck.formats.torch_pickle import TorchReadError
from tests.conftest import FIXTURES, PEAK

PROTO2 = b"\x80\x02"
STOP = b"."
NONE, EMPTY_DICT, EMPTY_TUPLE, TUPLE1, TUPLE2 = b"N", b"}", b")", b"\x85", b"\x86"
SETITEM, BUILD, POP, REDUCE = b"s", b"b", b"0", b"R"


def glob(module: str, name: str) -> bytes:
    """GLOBAL: push ``module.name`` as the unpickler resolves it."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def text(value: str) -> bytes:
    """BINUNICODE: push a str."""
    raw = value.encode()
    return b"X" + struct.pack("<I", len(raw)) + raw


def integer(value: int) -> bytes:
    """BININT / LONG1: push an int."""
    if 0 <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(raw)]) + raw


def set_attributes(target: bytes, **attrs: bytes) -> bytes:
    """``target`` (pushed), then BUILD with slot state: ``setattr(target, k, v)`` for each,
    then POP: what a pickle does to change a class or a shared object."""
    items = b"".join(text(k) + v + SETITEM for k, v in attrs.items())
    return target + NONE + EMPTY_DICT + items + TUPLE2 + BUILD + POP


def pickle_of(*ops: bytes, result: bytes = NONE) -> bytes:
    return PROTO2 + b"".join(ops) + result + STOP


def write(tmp_path: Path, data: bytes, name: str = ".metadata") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def refused(load: Any, path: Path) -> str:
    with pytest.raises(InputError) as e:
        load(path)
    assert e.value.path == str(path)
    assert "\n" not in str(e.value)
    return e.value.reason


# --- the steering attack, end to end ---------------------------------------------------------


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The DeepSeek-V3 fixture as a torch_dist checkpoint, by the built-in converter."""
    from mtpcheck.convert.builtin import hf_to_megatron
    from mtpcheck.formats import open_checkpoint

    out = tmp_path_factory.mktemp("converted") / "megatron"
    hf_to_megatron(open_checkpoint(FIXTURES / "deepseek_v3"), out)
    return out


def _chunks_moved_outside(converted: Path, tmp_path: Path, steer: bytes) -> Path:
    """A copy whose data files lie outside it, its index pointing there through ``../``,
    with ``steer`` run before the index is built."""
    root = Path(shutil.copytree(converted, tmp_path / "ckpt"))
    iteration = root / "release"
    meta = pickle.loads((iteration / ".metadata").read_bytes())  # torch's own classes
    (tmp_path / "outside").mkdir()
    for data in iteration.glob("*.distcp"):
        shutil.move(data, tmp_path / "outside" / data.name)
    for info in meta.storage_data.values():
        info.relative_path = "../../outside/" + info.relative_path
    body = pickle.dumps(meta, protocol=2)
    (iteration / ".metadata").write_bytes(body[:2] + steer + body[2:])
    return root


def test_a_pickle_cannot_tell_the_path_class_it_is_never_absolute(
    converted: Path, tmp_path: Path, run_cli
) -> None:
    steer = set_attributes(
        glob("pathlib", "PurePosixPath"),
        is_absolute=glob("builtins", "dict"),  # called: {} (falsy)
        parts=EMPTY_TUPLE,  # no ".." among ()
    )
    root = _chunks_moved_outside(converted, tmp_path / "steered", steer)
    run = run_cli("diff", FIXTURES / "deepseek_v3", root)
    assert run.exit_code == 2, run
    assert run.stderr == (
        f"mtpcheck: error: {root}/release/.metadata: unreadable pickle (the pickle changes "
        "pathlib.PurePosixPath)\n"
    )
    # the same process, next file: the path class is intact, and a chunk outside is refused
    assert pathlib.PurePosixPath("/x").is_absolute() and "is_absolute" not in vars(
        pathlib.PurePosixPath
    )
    plain = _chunks_moved_outside(converted, tmp_path / "plain", b"")
    run = run_cli("diff", FIXTURES / "deepseek_v3", plain)
    assert run.exit_code == 2, run
    assert "points to '../../outside/__0_0.distcp', outside the dir" in run.stderr
    assert run_cli("diff", FIXTURES / "deepseek_v3", converted).exit_code == 0


# --- .metadata: what a file may not change ---------------------------------------------------


@pytest.mark.parametrize(
    ("ops", "reason"),
    [
        (  # a megatron class stand-in: BUILD on the class
            set_attributes(glob("megatron.core.transformer", "TransformerConfig"), x=NONE),
            "the pickle changes a class it was handed",
        ),
        (  # a DCP data class stand-in
            set_attributes(glob("torch.distributed.checkpoint.metadata", "Metadata"), y=NONE),
            "the pickle changes a class it was handed",
        ),
        (  # a class without a __setstate__ of its own: BUILD sets the attribute itself
            set_attributes(glob("argparse", "Namespace"), mtp_num_layers=integer(1)),
            "refusing to unpickle argparse.Namespace (not on the allowlist); loading this file "
            "could run arbitrary code",
        ),
        (  # a stand-in function's defaults: torch.Size() would then return them
            set_attributes(glob("torch", "Size"), __defaults__=EMPTY_TUPLE),
            "the pickle changes torch.Size",
        ),
        (  # a dtype every later file shares a name with
            set_attributes(glob("torch", "bfloat16"), name=text("float32")),
            "the pickle changes TorchDType torch.bfloat16",
        ),
        (  # the container types handed out are builtin: their attributes cannot be set
            set_attributes(glob("collections", "OrderedDict"), z=NONE),
            "TypeError: cannot set 'z' attribute of immutable type 'collections.OrderedDict'",
        ),
    ],
)
def test_what_a_metadata_pickle_is_handed_cannot_be_changed(
    ops: bytes, reason: str, tmp_path: Path
) -> None:
    path = write(tmp_path, pickle_of(ops))
    said = refused(load_raw_pickle, path)
    assert said == (reason if reason.startswith("refusing") else f"unreadable pickle ({reason})")


def test_each_load_gets_classes_of_its_own(tmp_path: Path) -> None:
    """Two loads of the same class name: two classes, neither the module's."""
    one = write(tmp_path, pickle_of(result=glob("megatron.core", "Config")), "a")
    two = write(tmp_path, pickle_of(result=glob("megatron.core", "Config")), "b")
    first, second = load_raw_pickle(one), load_raw_pickle(two)
    assert first is not second and first.__name__ == second.__name__ == "Config"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (  # one memo slot at 2**26: a gigabyte of memo table from 13 bytes
            PROTO2 + NONE + b"r" + struct.pack("<I", 2**26) + STOP,
            "memo index 67108864 after 3 opcodes",
        ),
        (  # the text form of the same
            PROTO2 + NONE + b"p67108864\n" + STOP,
            "memo index past the 3 opcodes before it",
        ),
        (  # bytes(n): n bytes from a few
            pickle_of(result=glob("builtins", "bytes") + integer(2**30) + TUPLE1 + REDUCE),
            "bytes of (1073741824,)",
        ),
        (
            pickle_of(result=glob("builtins", "bytearray") + integer(2**30) + TUPLE1 + REDUCE),
            "bytes of (1073741824,)",
        ),
        (  # a text codec that would inflate what it is given
            pickle_of(
                result=glob("_codecs", "encode") + text("x") + text("zlib") + TUPLE2 + REDUCE
            ),
            "_codecs.encode of ('x', 'zlib')",
        ),
        (  # a stand-in called with arguments it does not take
            pickle_of(result=glob("torch", "Size") + text("a") + TUPLE1 + REDUCE),
            "torch.Size of 'a'",
        ),
        (
            pickle_of(result=glob("torch", "device") + EMPTY_TUPLE + REDUCE),
            "torch.device called with ()",
        ),
        (  # the exit signal stays a number, not a process-wide enum member
            pickle_of(result=glob("signal", "Signals") + integer(99) + TUPLE1 + REDUCE),
            None,
        ),
    ],
)
def test_what_a_pickle_may_make_is_bounded_by_its_size(
    data: bytes, reason: str | None, tmp_path: Path
) -> None:
    path = write(tmp_path, data)
    if reason is None:  # signal.Signals is allowed in .pt files only
        assert "refusing to unpickle signal.Signals" in refused(load_raw_pickle, path)
        return
    assert refused(load_raw_pickle, path) == f"unreadable pickle ({reason})"


def test_a_pickle_naming_ever_new_classes_is_refused(tmp_path: Path) -> None:
    ops = b"".join(glob("megatron.core", f"C{i}") + POP for i in range(10_001))
    path = write(tmp_path, pickle_of(ops))
    assert refused(load_raw_pickle, path) == (
        "unreadable pickle (the pickle names more than 10000 classes)"
    )


# --- .pt files: the torch.save archive -------------------------------------------------------


def archive(data_pkl: bytes, records: dict[str, bytes] | None = None, **zip_kw: Any) -> bytes:
    """A ``torch.save``-shaped zip: ``archive/data.pkl``, its byte order, its storages."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", **zip_kw) as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/byteorder", "little")
        for key, value in (records or {}).items():
            z.writestr(f"archive/data/{key}", value)
    return out.getvalue()


def float8_file(tmp_path: Path) -> Path:
    """torch's own save of a float8 tensor: an untyped storage, rebuilt by
    ``_rebuild_tensor_v3``."""
    import torch

    path = tmp_path / "float8.pt"
    torch.save({"w": torch.ones(4, dtype=torch.float8_e4m3fn)}, path)
    return path


def test_the_untyped_storage_stand_in_cannot_be_changed(tmp_path: Path) -> None:
    """A file telling the shared untyped-storage type it holds bfloat16 would make every later
    float8 tensor unreadable (and the other file blamed)."""
    steer = set_attributes(glob("torch.storage", "UntypedStorage"), dtype=text("bf16"))
    path = write(tmp_path, archive(pickle_of(steer)), "steer.pt")
    assert refused(load_torch_file, path) == (
        "unreadable torch.save file (the pickle changes StorageType StorageType(dtype=None))"
    )
    loaded = load_torch_file(float8_file(tmp_path))  # the next file reads as it should
    assert (loaded["w"].dtype, loaded["w"].shape) == ("F8_E4M3", (4,))


def test_a_tensor_is_rebuilt_by_a_tensor_rebuilder_only(tmp_path: Path) -> None:
    data = (
        PROTO2
        + glob("torch._tensor", "_rebuild_from_type_v2")
        + b"("
        + glob("builtins", "bytearray")
        + glob("torch", "Tensor")
        + integer(2**30)
        + TUPLE1
        + EMPTY_DICT
        + b"t"
        + REDUCE
        + STOP
    )
    path = write(tmp_path, archive(data), "rebuild.pt")
    assert refused(load_torch_file, path) == (
        "unreadable torch.save file (tensor of another type, or rebuilt by something else)"
    )


def test_two_records_of_one_name_are_ambiguous(tmp_path: Path) -> None:
    """torch reads the first of two same-named records; a reader taking the last would report
    bytes torch never loads."""
    good = float8_file(tmp_path).read_bytes()
    with zipfile.ZipFile(io.BytesIO(good)) as z:
        first = z.namelist()[0]
        prefix = first.split("/", 1)[0]
    dup = tmp_path / "dup.pt"
    shutil.copy(tmp_path / "float8.pt", dup)
    with zipfile.ZipFile(dup, "a") as z:
        z.writestr(f"{prefix}/data.pkl", pickle_of())
    assert refused(load_torch_file, dup) == (
        f"unreadable torch.save file (two records named '{prefix}/data.pkl' (ambiguous))"
    )


def test_a_compressed_record_inflating_past_the_ratio_is_refused(tmp_path: Path) -> None:
    """torch's save of a megabyte of zeros, its records deflated: the storage inflates a
    thousandfold, past the 64 allowed, and is refused before it is inflated."""
    import torch

    saved = tmp_path / "zeros.pt"
    torch.save({"w": torch.zeros(1 << 18, dtype=torch.float32)}, saved)
    bomb = tmp_path / "bomb.pt"
    with zipfile.ZipFile(saved) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    tensor = load_torch_file(bomb)["w"]  # the pickle is small: it loads
    with pytest.raises(TorchReadError, match=r"inflates from \d+ to 1048576 bytes, more than 64"):
        tensor.elements()


def test_an_encrypted_or_unknown_compression_record_is_one_line(tmp_path: Path) -> None:
    raw = bytearray(archive(pickle_of()))
    central = raw.rfind(b"PK\x01\x02")  # the last record's central directory entry
    first = raw.find(b"PK\x01\x02")
    encrypted = bytearray(raw)
    encrypted[first + 8] |= 1  # general purpose flag: encrypted
    path = write(tmp_path, bytes(encrypted), "encrypted.pt")
    assert refused(load_torch_file, path).startswith("unreadable torch.save file (record ")
    unknown = bytearray(raw)
    unknown[first + 10 : first + 12] = struct.pack("<H", 99)  # compression method 99
    assert central >= first
    path = write(tmp_path, bytes(unknown), "unknown.pt")
    assert refused(load_torch_file, path).startswith("unreadable torch.save file (record ")


# --- mtpcheck's own faults are exit 3, never a verdict or "bad input" -----------------------


def _injected(*args: Any, **kwargs: Any) -> Any:
    raise KeyError("injected")


def test_a_fault_in_the_unpicklers_stand_ins_is_exit_3(
    converted: Path, run_cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in what the unpickler calls (here: a tensor record made with the wrong type, a
    TypeError in mtpcheck's own frame) is no "unreadable torch.save file": the file is fine."""
    monkeypatch.setattr("mtpcheck.formats.torch_pickle.StoredTensor", dict)
    run = run_cli("diff", FIXTURES / "deepseek_v3", converted, "--quiet")
    assert run.exit_code == 3, run
    assert run.stderr.startswith("mtpcheck: internal error: TypeError: dict expected at most 1")


def test_a_fault_in_megatron_cores_model_of_the_config_is_exit_3(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was a FAIL of the user's checkpoint: "the config lacks 'injected'"."""
    monkeypatch.setattr("mtpcheck.convert.megatron_names.expected_model_names", _injected)
    run = run_cli("roundtrip", FIXTURES / "deepseek_v3", "--workdir", tmp_path, "--quiet")
    assert run.exit_code == 3, run
    assert run.stderr.startswith("mtpcheck: internal error: KeyError: 'injected'")
    assert not any(tmp_path.iterdir())


def test_every_renderer_takes_a_check_without_findings() -> None:
    from mtpcheck.model import CheckName, CheckResult, Report
    from mtpcheck.report import renderer

    report = Report("inspect", (), (CheckResult(CheckName.INTEGRITY, "Nothing found", ()),))
    for kind in ("table", "json", "junit", "markdown"):
        out = io.StringIO()
        renderer(kind).render(report, out)
        assert out.getvalue(), kind  # the table and Markdown list findings: none here
    assert '"name": "integrity"' in _rendered(renderer("json"), report)
    assert '<skipped message="no findings"' in _rendered(renderer("junit"), report)


def _rendered(renderer: Any, report: Any) -> str:
    out = io.StringIO()
    renderer.render(report, out)
    return out.getvalue()


# --- what torch itself writes, and mtpcheck does not read ------------------------------------


def test_an_expanded_tensor_is_not_read_as_more_than_its_storage(tmp_path: Path) -> None:
    """torch saves an expanded tensor as its one stored element and strides of 0: read whole,
    16 million elements (64 MB) from 4 bytes."""
    import torch

    path = tmp_path / "expanded.pt"
    torch.save({"w": torch.zeros(1).expand(1 << 24)}, path)
    assert refused(load_torch_file, path) == (
        "unreadable torch.save file (tensor [16777216] with strides [0] has 16777216 "
        "elements, more than the 1 its storage holds (expanded; not read))"
    )


@pytest.mark.parametrize(
    ("make", "named"),
    [
        ("torch.ones(2, dtype=torch.complex128)", "torch.ComplexDoubleStorage"),
        (
            "torch.zeros(2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)",
            "torch.float4_e2m1fn_x2",
        ),
    ],
)
def test_a_type_mtpcheck_does_not_read_is_named_unsupported_not_an_attack(
    make: str, named: str, tmp_path: Path
) -> None:
    import torch

    path = tmp_path / "typed.pt"
    torch.save({"w": eval(make, {"torch": torch})}, path)
    assert refused(load_torch_file, path) == (
        f"holds a tensor of {named}, a type mtpcheck does not read (an unsupported dtype or "
        "tensor kind, not an attack: nothing was loaded or run)"
    )


# --- files that are no regular file, grow without bound, or change while read ----------------


def test_a_file_that_shrinks_while_read_is_one_error_not_a_crash(tmp_path: Path) -> None:
    """A rank file still being written: read after it shrank, a memory-mapped tensor once
    killed the process (SIGBUS, exit 135, nothing said); the bytes are read by position now."""
    import torch

    path = tmp_path / "model_optim_rng.pt"
    torch.save({"w": torch.ones(1 << 16)}, path)
    tensor = load_torch_file(path)["w"]
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    with pytest.raises(TorchReadError, match="the file shrank since it was opened"):
        tensor.elements()


@pytest.mark.parametrize(
    ("rel", "reason"),
    [
        (
            "latest_checkpointed_iteration.txt",
            "3221225472 bytes, more than the 1048576 it may hold",
        ),
        ("release/metadata.json", "3221225472 bytes, more than the 1048576 it may hold"),
        ("release/.metadata", "3221225472 bytes, more than the 1073741824 it may hold"),
    ],
)
def test_a_huge_small_file_is_refused_before_it_is_read(
    converted: Path, rel: str, reason: str, tmp_path: Path, run_cli
) -> None:
    """A 3 GiB sparse tracker, metadata.json or .metadata was read whole."""
    root = Path(shutil.copytree(converted, tmp_path / "ckpt"))
    with open(root / rel, "r+b") as f:
        f.truncate(3 << 30)
    run = run_cli("inspect", root, "--quiet")
    assert (run.exit_code, run.stderr) == (2, f"mtpcheck: error: {root / rel}: {reason}\n")


def test_a_fifo_in_place_of_a_file_does_not_block(converted: Path, tmp_path: Path, run_cli) -> None:
    """A FIFO named as the common state (or the tracker) blocked ``open()`` for ever; it is
    taken for the missing file it stands in for."""
    root = Path(shutil.copytree(converted, tmp_path / "ckpt"))
    for rel in ("release/common.pt", "latest_checkpointed_iteration.txt"):
        (root / rel).unlink()
        os.mkfifo(root / rel)
    run = run_cli("inspect", root / "release", "--quiet", "--format", "json")
    assert run.exit_code == 1, run
    failed = [f for c in json.loads(run.stdout)["checks"] for f in c["findings"]]
    assert ("common.pt", "common.pt is missing (no saved args)") in [
        (f["subject"], f["message"]) for f in failed if f["status"] == "fail"
    ]
    run = run_cli("inspect", root, "--quiet")
    assert run.exit_code == 2 and "no latest_checkpointed_iteration.txt" in run.stderr, run


def test_args_nested_past_any_config_are_left_out(converted: Path, tmp_path: Path, run_cli) -> None:
    """A ``common.pt`` whose args hold a list nested 100,000 deep (a few hundred kilobytes):
    the value is left out of the config (``json_safe`` recursed until it failed, exit 3)."""
    root = Path(shutil.copytree(converted, tmp_path / "ckpt"))
    common = root / "release" / "common.pt"
    with zipfile.ZipFile(common) as z:
        prefix = z.namelist()[0].split("/", 1)[0]
    depth = 100_000
    nested = b"]" * depth + b"a" * (depth - 1)  # EMPTY_LIST x n, APPEND x n-1: nested n deep
    args = glob("argparse", "Namespace") + EMPTY_TUPLE + b"\x81"  # NEWOBJ
    args += EMPTY_DICT + text("deep") + nested + SETITEM + BUILD
    data = PROTO2 + EMPTY_DICT + text("args") + args + SETITEM + STOP
    with zipfile.ZipFile(common, "w") as z:
        z.writestr(f"{prefix}/data.pkl", data)
        z.writestr(f"{prefix}/byteorder", "little")
    run = run_cli("inspect", root, "--quiet", "--format", "json")
    assert run.exit_code in (0, 1), run
    (summary,) = json.loads(run.stdout)["inputs"]
    assert "deep" not in json.dumps(summary)


def test_chunks_on_the_same_stored_bytes_do_not_make_a_tensor(
    converted: Path, tmp_path: Path, run_cli
) -> None:
    """An index that cuts a tensor into two chunks both stored on one byte range would have it
    assembled at its declared size from bytes read twice (2 GiB declared over a few stored);
    the tensor is named unreadable instead."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    root = Path(shutil.copytree(converted, tmp_path / "ckpt"))
    path = root / "release" / ".metadata"
    meta = pickle.loads(path.read_bytes())
    key = "embedding.word_embeddings.weight"
    item = meta.state_dict_metadata[key]
    (whole,) = item.chunks
    rows = whole.sizes[0]
    halves = [
        ChunkStorageMetadata(
            offsets=type(whole.offsets)([0, 0]),
            sizes=type(whole.sizes)([rows // 2, whole.sizes[1]]),
        ),
        ChunkStorageMetadata(
            offsets=type(whole.offsets)([rows // 2, 0]),
            sizes=type(whole.sizes)([rows - rows // 2, whole.sizes[1]]),
        ),
    ]
    item.chunks = halves
    stored = meta.storage_data[MetadataIndex(key, whole.offsets)]
    for half in halves:
        meta.storage_data[MetadataIndex(key, half.offsets)] = stored
    path.write_bytes(pickle.dumps(meta))
    run = run_cli("inspect", root, "--quiet", "--format", "json")
    assert run.exit_code == 1, run
    findings = [
        (f["subject"], f["message"])
        for c in json.loads(run.stdout)["checks"]
        for f in c["findings"]
        if f["status"] == "fail"
    ]
    assert (key, f"{key}: two chunks name the same stored bytes") in findings


# --- memory: what a refusal costs, measured in a process of its own --------------------------

_LOAD = (
    PEAK
    + """
import sys
from mtpcheck.errors import InputError
from mtpcheck.formats.safe_pickle import load_raw_pickle, load_torch_file
from mtpcheck.formats.torch_pickle import TorchReadError
path = sys.argv[1]
try:
    if path.endswith(".pt"):
        for value in load_torch_file(path).values():
            value.elements()
    else:
        load_raw_pickle(path)
except (InputError, TorchReadError) as e:
    print(e)
print(peak_kib())
"""
)


def _bombs(tmp_path: Path) -> dict[str, Path]:
    import torch

    zeros = tmp_path / "zeros.pt"
    torch.save({"w": torch.zeros(1 << 26, dtype=torch.uint8)}, zeros)  # 64 MiB of zeros
    deflated = tmp_path / "deflated.pt"
    with zipfile.ZipFile(zeros) as src, zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    zeros.unlink()
    expanded = tmp_path / "expanded.pt"
    torch.save({"w": torch.zeros(1, dtype=torch.uint8).expand(1 << 31)}, expanded)
    return {
        "memo": write(tmp_path, PROTO2 + NONE + b"r" + struct.pack("<I", 2**30) + STOP, "memo"),
        "bytes": write(
            tmp_path,
            pickle_of(result=glob("builtins", "bytes") + integer(2**31) + TUPLE1 + REDUCE),
            "bytes",
        ),
        "deflated": deflated,
        "expanded": expanded,
    }


@pytest.mark.parametrize("bomb", ["memo", "bytes", "deflated", "expanded"])
def test_a_refusal_costs_what_the_file_holds_not_what_it_claims(bomb: str, tmp_path: Path) -> None:
    """Each claims a gigabyte or more (a memo slot at 2**30, bytes(2**31), 64 MiB deflated to
    64 KiB, 2**31 elements on one stored byte); refused, each costs its process under 256 MiB,
    the interpreter and numpy included."""
    path = _bombs(tmp_path)[bomb]
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=120
    )
    said, peak = done.stdout.strip().rsplit("\n", 1)
    assert done.returncode == 0 and said, done
    assert int(peak) < 256 * 1024, (bomb, peak, said)  # KiB


def test_an_index_entry_not_named_by_a_string_is_no_crash(
    converted: Path, tmp_path: Path, run_cli
) -> None:
    """A storage entry whose ``fqn`` is no string (a tuple here; a list was a TypeError, exit
    3): it names no tensor, and the tensor it was for has no stored chunk."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    root = Path(shutil.copytree(converted, tmp_path / "ckpt"))
    path = root / "release" / ".metadata"
    meta = pickle.loads(path.read_bytes())
    key = "embedding.word_embeddings.weight"
    index = next(i for i in meta.storage_data if i.fqn == key)
    meta.storage_data[MetadataIndex((key,), index.offset)] = meta.storage_data.pop(index)
    path.write_bytes(pickle.dumps(meta))
    run = run_cli("inspect", root, "--quiet")
    assert run.exit_code == 2, run
    assert run.stderr == (f"mtpcheck: error: {path}: no storage entry for chunk (0, 0) of {key}\n")


def test_empty_tensors_read_as_empty(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "empty.pt"
    torch.save({"a": torch.zeros(0, 5), "b": torch.zeros(10)[10:]}, path)
    loaded = load_torch_file(path)
    assert [loaded[k].elements().size for k in ("a", "b")] == [0, 0]
