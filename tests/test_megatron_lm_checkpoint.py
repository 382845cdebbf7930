"""A checkpoint written by Megatron-LM itself (megatron-core 0.19.2's ``megatron.training``).

``tests/data/megatron_lm_0192`` was written by ``tests/thirdparty/make_megatron_lm_checkpoint.py``
with Megatron-LM's real argument parser and ``save_checkpoint`` (see that script for why it is
shipped rather than rebuilt). megatron-core 0.19 writes no ``common.pt``: the common state
(``args``, ``iteration``, ...) is a bytes item inside the checkpoint's own data file.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from mtpcheck import CheckName
from mtpcheck.errors import InputError
from mtpcheck.formats import open_checkpoint
from mtpcheck.formats.megatron_common import canonical_name
from tests.conftest import Run

DATA = Path(__file__).parent / "data" / "megatron_lm_0192"
ITERATION = DATA / "iter_0000001"


def test_args_come_from_the_embedded_common_state() -> None:
    assert not (ITERATION / "common.pt").exists()
    ckpt = open_checkpoint(DATA)
    assert ckpt.issues == ()
    assert ckpt.config_path == f"{ITERATION / '.metadata'} (common_state/shard_0_1)"
    assert ckpt.config["mtp_num_layers"] == 1 and ckpt.config["num_layers"] == 2
    # fields only Megatron-LM's own parser produces
    assert {"account_for_embedding_in_pipeline_split", "padded_vocab_size"} <= set(ckpt.config)


def test_tensors_are_the_models_state_dict() -> None:
    from safetensors.torch import load_file

    reference = load_file(str(DATA / "reference.safetensors"))
    ckpt = open_checkpoint(DATA)
    expected = {canonical_name(k): v for k, v in reference.items()}
    assert sorted(ckpt.tensors) == sorted(expected)
    for name, tensor in expected.items():
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        assert b"".join(ckpt.read_chunks(name, 1 << 20)) == raw, name


def test_inspect_passes(run_cli) -> None:
    run: Run = run_cli("inspect", DATA, "--format", "json")
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    (count,) = [c for c in report["checks"] if c["name"] == CheckName.MTP_COUNT]
    assert count["findings"][0]["message"] == "1 declared (mtp_num_layers); 1 present, complete"


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        import os

        return os.system, (f"touch {self.marker}",)


def test_a_hostile_embedded_common_state_is_refused(tmp_path: Path) -> None:
    """The common state is a pickle too: it goes through the same allowlist as common.pt."""
    copy = Path(shutil.copytree(DATA, tmp_path / "ckpt")) / "iter_0000001"
    marker = tmp_path / "pwned"
    blob = io.BytesIO()
    torch.save([{"args": _Payload(marker)}], blob)
    data = copy / "__0_0.distcp"
    offset = data.stat().st_size
    with open(data, "ab") as f:
        f.write(blob.getvalue())
    _point_common_state(copy, offset=offset, length=len(blob.getvalue()))
    with pytest.raises(InputError) as e:
        open_checkpoint(copy)
    assert str(e.value).startswith(
        f"{copy / '.metadata'} (common_state/shard_0_1): refusing to unpickle posix.system"
    )
    assert not marker.exists()


def _point_common_state(copy: Path, **changes: Any) -> None:
    metadata = pickle.loads((copy / ".metadata").read_bytes())
    for index, info in metadata.storage_data.items():
        if index.fqn.startswith("common_state/"):
            for key, value in changes.items():
                setattr(info, key, value)
    (copy / ".metadata").write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"length": 10**6}, "__0_0.distcp: truncated: common_state/shard_0_1 lies past its end"),
        (
            {"relative_path": "../elsewhere.distcp"},
            ".metadata (common_state/shard_0_1): points to '../elsewhere.distcp', outside the "
            "checkpoint directory",
        ),
        ({"offset": -1}, ".metadata (common_state/shard_0_1): has no valid byte range"),
    ],
)
def test_a_broken_common_state_entry_is_one_clear_error(
    tmp_path: Path, changes: dict[str, Any], reason: str
) -> None:
    copy = Path(shutil.copytree(DATA, tmp_path / "ckpt")) / "iter_0000001"
    _point_common_state(copy, **changes)
    with pytest.raises(InputError) as e:
        open_checkpoint(copy)
    assert str(e.value) == f"{copy}/{reason}"
