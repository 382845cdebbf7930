"""The ``.metadata`` allowlist: every data class torch's distributed checkpoint pickles loads;
callables of the same modules, and anything else, are refused before they run."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystemWriter, _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    ReadItem,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)

from mtpcheck.errors import InputError
from mtpcheck.formats.safe_pickle import load_raw_pickle


def _metadata_with_plans() -> Metadata:
    """Plans where torch and megatron-core keep them: ``planner_data``, and the
    ``all_local_plans`` attribute megatron-core's saver sets on the metadata."""
    key = "mtp.layers.0.eh_proj.weight"
    chunk = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([4, 8]))
    props = TensorProperties(dtype=torch.bfloat16)
    index = MetadataIndex(key, torch.Size([0, 0]))
    write = WriteItem(
        index=index,
        type=WriteItemType.SHARD,
        tensor_data=TensorWriteData(chunk=chunk, properties=props, size=torch.Size([4, 8])),
    )
    extra = WriteItem(index=MetadataIndex("common/_extra_state"), type=WriteItemType.BYTE_IO)
    read = ReadItem(
        type=LoadItemType.TENSOR,
        dest_index=index,
        dest_offsets=torch.Size([0, 0]),
        storage_index=index,
        storage_offsets=torch.Size([0, 0]),
        lengths=torch.Size([4, 8]),
    )
    metadata = Metadata(
        state_dict_metadata={
            key: TensorStorageMetadata(props, torch.Size([4, 8]), [chunk]),
            "common/_extra_state": BytesStorageMetadata(),
        },
        planner_data={
            "plans": [SavePlan([write, extra], storage_data=_StoragePrefix("__0_"))],
            "load": LoadPlan([read]),
        },
        storage_data={index: _StorageInfo("__0_0.distcp", 0, 64)},
        storage_meta=StorageMeta(checkpoint_id=Path("/ckpt"), save_id="s", load_id="l"),
    )
    metadata.all_local_plans = [SavePlan([write])]  # type: ignore[attr-defined]
    return metadata


def test_save_and_load_plans_in_metadata_are_read(tmp_path: Path) -> None:
    """Every field the reader uses survives, as inert stand-ins (no torch class is built)."""
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(_metadata_with_plans()))
    loaded = load_raw_pickle(path)
    key = "mtp.layers.0.eh_proj.weight"
    assert sorted(loaded.state_dict_metadata) == ["common/_extra_state", key]
    tensor = loaded.state_dict_metadata[key]
    assert (str(tensor.properties.dtype), tensor.properties.dtype.code) == (
        "torch.bfloat16",
        "BF16",
    )
    assert tensor.size == (4, 8) and type(tensor.size) is tuple
    assert [(c.offsets, c.sizes) for c in tensor.chunks] == [((0, 0), (4, 8))]
    ((index, where),) = loaded.storage_data.items()
    assert (index.fqn, index.offset) == (key, (0, 0))
    assert (where.relative_path, where.offset, where.length) == ("__0_0.distcp", 0, 64)
    (write, extra) = loaded.planner_data["plans"][0].items
    assert type(write.type).__name__ == "WriteItemType"
    assert write.type._args == (WriteItemType.SHARD.value,)
    assert extra.index.fqn == "common/_extra_state"
    assert loaded.planner_data["load"].items[0].lengths == (4, 8)
    assert [len(plan.items) for plan in loaded.all_local_plans] == [1]
    assert not any(m.startswith("torch") for m in _modules_imported_by(path))


def _modules_imported_by(path: Path) -> list[str]:
    """Modules a fresh interpreter has imported after loading ``path``."""
    code = (
        "import sys\n"
        "from mtpcheck.formats.safe_pickle import load_raw_pickle\n"
        f"load_raw_pickle({str(path)!r})\n"
        "print('\\n'.join(sorted(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


class _Gadget:
    """Unpickles into a call of ``target(*args)``."""

    def __init__(self, target: object, *args: object) -> None:
        self.target, self.args = target, args

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return self.target, self.args


@pytest.mark.parametrize(
    ("gadget", "refused"),
    [
        (
            _Gadget(FileSystemWriter, "/tmp/written-by-a-pickle"),
            "torch.distributed.checkpoint.filesystem.FileSystemWriter",
        ),
        (_Gadget(torch.save, {}, "/tmp/written-by-a-pickle"), "torch.serialization.save"),
        (_Gadget(io.open, "/tmp/written-by-a-pickle", "w"), "io.open"),
    ],
)
def test_callables_beside_the_data_classes_are_refused(
    tmp_path: Path, gadget: _Gadget, refused: str
) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(pickle.dumps(Metadata({}, planner_data=[gadget])))
    with pytest.raises(InputError) as e:
        load_raw_pickle(path)
    assert str(e.value) == (
        f"{path}: refusing to unpickle {refused} (not on the allowlist); "
        "loading this file could run arbitrary code"
    )
    assert not Path("/tmp/written-by-a-pickle").exists()
