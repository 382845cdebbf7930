"""The torch_dist writer produces checkpoints megatron-core loads strictly and bit for bit.

Round trip: a tiny GPTModel (seed 1) gives canonical tensors, ``write_torch_dist`` writes them
without a model, a second model (seed 2, different in every tensor) loads them with
``StrictHandling.RAISE_ALL`` + ``load_state_dict(strict=True)`` and must then equal model 1 byte
for byte. The writer's sharded state dict is also compared field by field with the model's own
``sharded_state_dict()``. Families megatron-core cannot build on CPU are checked against their
modules where a module can be built alone, else against the name table.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.dist_checkpointing.core import CheckpointingException
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, apply_factories
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.ssm import gated_delta_net
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_layer import TransformerLayer
from torch.distributed.checkpoint import FileSystemReader

from mtpcheck.convert import megatron_config as mc
from mtpcheck.convert import megatron_names as mn
from mtpcheck.convert.torch_dist_writer import (
    build_sharded_state_dict,
    single_process_group,
    write_torch_dist,
)
from tests.conftest import FIXTURES
from tests.megatron_models import build_gpt_model, canonical_tensors, sharded_metadata, strict_load

# deepseek_v3 (MLA) builds only with the two stand-ins of tests/megatron_models.py
ROUND_TRIP = ("glm4_moe", "mimo", "deepseek_v3")
METADATA_JSON = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}


def hf_config(family: str) -> dict[str, Any]:
    return json.loads((FIXTURES / family / "config.json").read_text())


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


@pytest.fixture
def megatron() -> Iterator[None]:
    with single_process_group():
        yield


def _write(tmp: Path, family: str, tensors: dict[str, torch.Tensor], iteration: Any) -> Path:
    hf = hf_config(family)
    return write_torch_dist(
        tmp,
        tensors,
        mc.transformer_config_kwargs(hf, family),
        mc.args_namespace(hf, family),
        iteration,
    )


@pytest.mark.parametrize("family", ROUND_TRIP)
def test_round_trip_is_bit_exact(megatron: None, tmp_path: Path, family: str) -> None:
    hf = hf_config(family)
    source = build_gpt_model(hf, family, seed=1)
    tensors = canonical_tensors(source)
    assert {k: tuple(v.shape) for k, v in tensors.items()} == mn.expected_model_names(family, hf)

    ckpt = _write(tmp_path, family, tensors, 1)

    assert ckpt == tmp_path / "iter_0000001"
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "common.pt",
        "metadata.json",
    ]
    assert json.loads((ckpt / "metadata.json").read_text()) == METADATA_JSON
    common = torch.load(ckpt / "common.pt", weights_only=False)
    assert isinstance(common["args"], argparse.Namespace)
    assert common["args"].mtp_num_layers == 1
    assert common["args"].num_layers == hf["num_hidden_layers"]
    assert common["args"].vocab_size == hf["vocab_size"]
    assert common["checkpoint_version"] == 3.0
    assert common["iteration"] == 1
    on_disk = FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    h = hf["hidden_size"]
    assert tuple(on_disk["mtp.layers.0.eh_proj.weight"].size) == (h, 2 * h)

    target = build_gpt_model(hf, family, seed=2)
    before = canonical_tensors(target)
    assert all(raw(before[k]) != raw(tensors[k]) for k in tensors), "seeds must differ"
    strict_load(target, ckpt)

    after = canonical_tensors(target)
    assert after.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert after[name].dtype == tensor.dtype, name
        assert after[name].shape == tensor.shape, name
        assert raw(after[name]) == raw(tensor), name


def test_stacked_and_per_layer_keys_on_disk(megatron: None, tmp_path: Path) -> None:
    mimo = build_gpt_model(hf_config("mimo"), "mimo", seed=1)
    disk = FileSystemReader(str(_write(tmp_path / "mimo", "mimo", canonical_tensors(mimo), 1)))
    keys = disk.read_metadata().state_dict_metadata
    # homogeneous: one key per tensor kind with a leading layer axis; fc1 is [gate; up]
    assert tuple(keys["decoder.layers.mlp.linear_fc1.weight"].size) == (2, 64, 16)
    assert "decoder.layers.self_attention.linear_qkv.layer_norm_weight" in keys
    assert "mtp.layers.0.transformer_layer.mlp.linear_fc1.layer_norm_weight" in keys
    assert not any(k.startswith("decoder.layers.0.") for k in keys)

    glm = build_gpt_model(hf_config("glm4_moe"), "glm4_moe", seed=1)
    disk = FileSystemReader(str(_write(tmp_path / "glm", "glm4_moe", canonical_tensors(glm), 1)))
    keys = disk.read_metadata().state_dict_metadata
    # moe_layer_freq is a list: per-layer keys; experts stacked on an expert axis
    assert tuple(keys["decoder.layers.0.mlp.linear_fc1.weight"].size) == (64, 16)
    assert tuple(keys["decoder.layers.1.mlp.experts.experts.linear_fc1.weight"].size) == (4, 16, 16)
    assert tuple(
        keys["mtp.layers.0.transformer_layer.mlp.experts.experts.linear_fc2.weight"].size
    ) == (4, 16, 8)
    assert "decoder.layers.1.mlp.router.expert_bias" in keys
    assert not any(k.startswith("decoder.layers.self_attention") for k in keys)


def _records(sharded: dict[str, Any]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for v in nested_values(sharded):
        if isinstance(v, ShardedTensor):
            out.append(
                (
                    v.key,
                    v.global_shape,
                    v.global_offset,
                    v.axis_fragmentations,
                    v.replica_id,
                    v.prepend_axis_num,
                    v.allow_shape_mismatch,
                    v.flattened_range,
                    v.dtype,
                    tuple(v.local_shape),
                    raw(v.data),
                )
            )
        else:
            assert isinstance(v, ShardedObject), type(v)
            out.append((v.key, v.global_shape, v.global_offset, v.replica_id, repr(v.data)))
    return sorted(out, key=repr)


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("glm4_moe", {}),
        ("glm4_moe", {"moe_layer_freq": 1}),  # homogeneous MoE: layer axis + expert axis
        ("mimo", {}),
        ("deepseek_v3", {}),
    ],
    ids=["glm4_moe", "glm4_moe-stacked", "mimo", "deepseek_v3"],
)
def test_sharded_state_dict_equals_the_models(
    megatron: None, family: str, overrides: dict[str, Any]
) -> None:
    hf = hf_config(family)
    model = build_gpt_model(hf, family, seed=1, **overrides)
    expected = model.sharded_state_dict(metadata=sharded_metadata())
    apply_factories(expected)
    kwargs = {**mc.transformer_config_kwargs(hf, family), **overrides}
    assert _records(build_sharded_state_dict(canonical_tensors(model), kwargs)) == _records(
        expected
    )


def test_mtp_model_layer_spelling_is_written_as_transformer_layer(megatron: None) -> None:
    hf = hf_config("glm4_moe")
    kwargs = mc.transformer_config_kwargs(hf, "glm4_moe")
    tensors = canonical_tensors(build_gpt_model(hf, "glm4_moe", seed=1))
    renamed = {k.replace(".transformer_layer.", ".mtp_model_layer."): v for k, v in tensors.items()}
    assert renamed.keys() != tensors.keys()
    assert _records(build_sharded_state_dict(renamed, kwargs)) == _records(
        build_sharded_state_dict(tensors, kwargs)
    )


@pytest.mark.parametrize("family", ["glm4_moe", "mimo"])
def test_missing_eh_proj_fails_strict_load(megatron: None, tmp_path: Path, family: str) -> None:
    hf = hf_config(family)
    tensors = canonical_tensors(build_gpt_model(hf, family, seed=1))
    del tensors["mtp.layers.0.eh_proj.weight"]
    ckpt = _write(tmp_path, family, tensors, 1)
    with pytest.raises(CheckpointingException, match="eh_proj"):
        strict_load(build_gpt_model(hf, family, seed=2), ckpt)


def test_release_layout_and_process_group_cleanup(tmp_path: Path) -> None:
    hf = hf_config("mimo")
    with single_process_group():
        tensors = canonical_tensors(build_gpt_model(hf, "mimo", seed=1))
    assert not dist.is_initialized()

    ckpt = _write(tmp_path, "mimo", tensors, "release")

    assert not dist.is_initialized()
    assert not parallel_state.model_parallel_is_initialized()
    assert ckpt == tmp_path / "release"
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert torch.load(ckpt / "common.pt", weights_only=False)["iteration"] == 0
    with single_process_group():
        target = build_gpt_model(hf, "mimo", seed=2)
        strict_load(target, ckpt)
        assert all(raw(v) == raw(tensors[k]) for k, v in canonical_tensors(target).items())


def test_refuses_bad_input(megatron: None, tmp_path: Path) -> None:
    hf = hf_config("mimo")
    kwargs = mc.transformer_config_kwargs(hf, "mimo")
    tensors = canonical_tensors(build_gpt_model(hf, "mimo", seed=1))
    with pytest.raises(ValueError, match="mtp_num_layers"):
        write_torch_dist(
            tmp_path, tensors, kwargs, mc.args_namespace(hf, "mimo", mtp_num_layers=None), 1
        )
    with pytest.raises(ValueError, match="iteration"):
        write_torch_dist(tmp_path, tensors, kwargs, mc.args_namespace(hf, "mimo"), -1)
    with pytest.raises(ValueError, match="layer 2"):
        bad = {**tensors, "decoder.layers.2.input_layernorm.weight": torch.ones(16)}
        build_sharded_state_dict(bad, kwargs)
    te = {**kwargs, "transformer_impl": "transformer_engine"}  # TE, but no gated delta net
    with pytest.raises(NotImplementedError, match="transformer_engine"):
        build_sharded_state_dict({}, te)
    (tmp_path / "iter_0000003").mkdir()
    (tmp_path / "iter_0000003" / "stale").write_text("x")
    with pytest.raises(FileExistsError):
        write_torch_dist(tmp_path, tensors, kwargs, mc.args_namespace(hf, "mimo"), 3)


# --- families megatron-core 0.16.1 cannot build on CPU --------------------------------------


def test_stacking_per_family() -> None:
    stacked = {
        f: mc.uses_stacked_layers(mc.transformer_config_kwargs(hf_config(f), f))
        for f in mc.layouts()
    }
    assert stacked == {
        "glm4_moe": False,
        "mimo": True,
        "deepseek_v3": False,
        "glm_moe_dsa": False,
        "qwen3_next": False,
    }
    assert [f for f, info in mc.layouts().items() if info.builds_on_cpu] == ["glm4_moe", "mimo"]


def _qwen3_next_local_kwargs(**extra: Any) -> dict[str, Any]:
    """Qwen3-Next kwargs for megatron's local modules (names and shapes unchanged)."""
    kw = mc.transformer_config_kwargs(hf_config("qwen3_next"), "qwen3_next")
    for name in ("transformer_impl", "experimental_attention_variant", "linear_attention_freq"):
        kw.pop(name)
    # torch's RMSNorm has no zero-centred gamma; the parameter is the same tensor either way
    kw["layernorm_zero_centered_gamma"] = False
    kw.update(extra)
    return kw


def test_qwen3_next_gated_delta_net_names(megatron: None) -> None:
    """GatedDeltaNet built alone; only its fused input norm (a TE module) is from the table."""
    # no initialisation: GatedDeltaNet's initialiser forks the CUDA RNG tracker
    kw = _qwen3_next_local_kwargs(perform_initialization=False)
    config = mc.transformer_config_class(kw)(**kw)
    submodules = gated_delta_net.GatedDeltaNetSubmodules(
        in_proj=ColumnParallelLinear, out_norm=WrappedTorchNorm, out_proj=RowParallelLinear
    )
    with (
        mock.patch.object(gated_delta_net, "HAVE_FLA", True),
        mock.patch.object(torch.cuda, "current_device", lambda: "cpu"),
    ):
        gdn = gated_delta_net.GatedDeltaNet(
            config,
            submodules,
            layer_number=1,
            pg_collection=ProcessGroupCollection.use_mpu_process_groups(),
        )
    built = {
        f"self_attention.{k}": tuple(v.shape)
        for k, v in gdn.state_dict().items()
        if not k.endswith("_extra_state")
    }
    table = mn.expected_layer_names("qwen3_next", hf_config("qwen3_next"), 0)
    attention = {k: v for k, v in table.items() if k.startswith("self_attention.")}
    fused_norm = {"self_attention.in_proj.layer_norm_weight": (16,)}
    assert {**built, **fused_norm} == attention

    sharded = gdn.sharded_state_dict(prefix="self_attention.", metadata=sharded_metadata())
    apply_factories(sharded)
    keys = {
        v.key.removeprefix("self_attention."): tuple(v.global_shape)
        for v in nested_values(sharded)
        if isinstance(v, ShardedTensor)
    }
    # on disk in_proj is split into q, k, v, z, beta, alpha rows and conv1d into q, k, v
    assert keys == {
        "in_proj.weight.query": (8, 16),
        "in_proj.weight.key": (8, 16),
        "in_proj.weight.value": (16, 16),
        "in_proj.weight.z": (16, 16),
        "in_proj.weight.beta": (4, 16),
        "in_proj.weight.alpha": (4, 16),
        "conv1d.weight.query": (8, 1, 2),
        "conv1d.weight.key": (8, 1, 2),
        "conv1d.weight.value": (16, 1, 2),
        "dt_bias": (4,),
        "A_log": (4,),
        "out_norm.weight": (4,),
        "out_proj.weight": (16, 16),
    }


def test_qwen3_next_full_attention_moe_layer_names(megatron: None) -> None:
    """The gated full-attention MoE layer (also the MTP inner layer) built with local modules.

    The Transformer Engine spec fuses ``input_layernorm`` into ``linear_qkv.layer_norm_weight``;
    every other name and shape comes from the built layer.
    """
    kw = _qwen3_next_local_kwargs(moe_layer_freq=1)
    config = mc.transformer_config_class(kw)(**kw)
    spec = get_gpt_layer_local_spec(num_experts=4, qk_layernorm=True, normalization="RMSNorm")
    with mock.patch.object(torch.cuda, "current_device", lambda: "cpu"):
        layer = TransformerLayer(config, spec.submodules, layer_number=2)
    built = {
        k.replace("input_layernorm.", "self_attention.linear_qkv.layer_norm_"): tuple(v.shape)
        for k, v in layer.state_dict().items()
        if not k.endswith("_extra_state")
    }
    hf = hf_config("qwen3_next")
    assert built == mn.expected_layer_names("qwen3_next", hf, 1)
    mtp = mn.expected_mtp_layer_names("qwen3_next", hf)
    assert {k.removeprefix("transformer_layer."): v for k, v in mtp.items()} == {
        **built,
        "enorm.weight": (16,),
        "hnorm.weight": (16,),
        "eh_proj.weight": (16, 32),
        "final_layernorm.weight": (16,),
    }
    # output gate: per query group [q heads, gate heads, k, v] rows
    assert built["self_attention.linear_qkv.weight"] == ((2 * 2 + 2 * 1) * 8, 16)


def test_deepseek_v3_te_spec_names_from_table() -> None:
    """Transformer Engine MLA names (Megatron-Bridge's spec): data only, TE is not installed."""
    te = mn.expected_layer_names("deepseek_v3", hf_config("deepseek_v3"), 1, spec="te")
    attention = {k: v for k, v in te.items() if "self_attention" in k or "layernorm" in k}
    assert attention == {
        "input_layernorm.weight": (16,),
        "self_attention.linear_q_down_proj.weight": (12, 16),
        "self_attention.linear_q_up_proj.weight": (2 * (8 + 4), 12),
        "self_attention.linear_q_up_proj.layer_norm_weight": (12,),
        "self_attention.linear_kv_down_proj.weight": (8 + 4, 16),
        "self_attention.linear_kv_up_proj.weight": (2 * (8 + 8), 8),
        "self_attention.linear_kv_up_proj.layer_norm_weight": (8,),
        "self_attention.linear_proj.weight": (16, 2 * 8),
        "pre_mlp_layernorm.weight": (16,),
    }
    with pytest.raises(ValueError, match="no local"):
        mn.expected_layer_names("qwen3_next", hf_config("qwen3_next"), 0, spec="local")


def test_the_cli_writer_imports_only_the_modules_it_uses(tmp_path: Path) -> None:
    """``convert hf-to-megatron`` in a fresh interpreter loads megatron-core's checkpointing
    modules without the package's ``__init__`` (no tensor_parallel, no torch._inductor), and
    what it writes is a checkpoint megatron-core loads strictly, equal byte for byte."""
    import subprocess
    import sys

    out = tmp_path / "megatron"
    code = (
        "import sys\n"
        "from mtpcheck.cli import main\n"
        f"rc = main(['convert', 'hf-to-megatron', {str(FIXTURES / 'deepseek_v3')!r}, "
        f"{str(out)!r}])\n"
        "heavy = [m for m in ('megatron.core.tensor_parallel', 'megatron.core.transformer', "
        "'torch._inductor') if m in sys.modules]\n"
        "print(rc, heavy)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.stdout.strip().splitlines()[-1] == "0 []", run.stdout + run.stderr
    from mtpcheck.cli import main

    assert main(["diff", "--all", str(FIXTURES / "deepseek_v3"), str(out)]) == 0
    hf = hf_config("deepseek_v3")
    with single_process_group():
        strict_load(build_gpt_model(hf, "deepseek_v3", seed=2), out / "release")


@pytest.mark.parametrize("durable", [True, False])
def test_record_checksums_only_where_the_checkpoint_is_kept(tmp_path: Path, durable: bool) -> None:
    """``durable=False`` (the round trip's intermediate, read back and deleted) skips the
    CRC-32 torch computes for each record; a kept checkpoint has them, as megatron-core writes
    it. Either way megatron-core loads it strictly, and the option is restored afterwards."""
    import io
    import zipfile

    from mtpcheck.convert.builtin import hf_to_megatron
    from mtpcheck.formats import open_checkpoint

    assert torch.serialization.get_crc32_options() is True
    ckpt = hf_to_megatron(open_checkpoint(FIXTURES / "mimo"), tmp_path / "out", durable=durable)
    assert torch.serialization.get_crc32_options() is True
    storage = FileSystemReader(str(ckpt)).read_metadata().storage_data
    crcs = set()
    for info in storage.values():
        with open(ckpt / info.relative_path, "rb") as f:
            f.seek(info.offset)
            archive = zipfile.ZipFile(io.BytesIO(f.read(info.length)))
        records = [i for i in archive.infolist() if "/data/" in i.filename and i.file_size]
        crcs.update(i.CRC for i in records)
        if durable:
            assert archive.testzip() is None  # every checksum right
    assert (crcs == {0}) is not durable
    with single_process_group():
        strict_load(build_gpt_model(hf_config("mimo"), "mimo", seed=2), ckpt)
