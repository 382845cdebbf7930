"""The built-in HF -> Megatron converter, verified by megatron-core itself.

Each fixture is converted into a torch_dist checkpoint; a megatron-core GPTModel built from
the same HF config (different random values everywhere) loads it with
``StrictHandling.RAISE_ALL`` + ``load_state_dict(strict=True)`` and must then hold, byte for
byte, what the mapping says each parameter is. The QKV interleave is checked semantically
too: megatron-core's own q/k/v split of the loaded ``linear_qkv`` must reproduce HF's
q_proj/k_proj/v_proj outputs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mtpcheck.convert.builtin import hf_to_megatron
from mtpcheck.convert.torch_dist_writer import single_process_group
from mtpcheck.errors import InputError
from mtpcheck.formats import open_checkpoint
from mtpcheck.formats.megatron_common import canonical_name
from mtpcheck.mapping import as_megatron
from mtpcheck.mapping.rules import Kind
from tests.conftest import FIXTURES
from tests.megatron_models import build_gpt_model, strict_load

BUILT = ("glm4_moe", "mimo", "deepseek_v3")


def _raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().view(torch.uint8).numpy().tobytes()


def _canonical(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Parameters under canonical names (megatron-core >= 0.17 calls the MTP layer's inner
    layer ``mtp_model_layer`` in memory)."""
    return {canonical_name(k): v for k, v in state.items() if not k.endswith("_extra_state")}


@pytest.mark.parametrize("family", BUILT)
def test_converted_checkpoint_loads_strictly_into_megatron_core(
    family: str, tmp_path: Path
) -> None:
    hf = open_checkpoint(FIXTURES / family)
    ckpt_dir = hf_to_megatron(hf, tmp_path / "megatron")
    expected = as_megatron(hf)
    with single_process_group():
        model = build_gpt_model(dict(hf.config), family, seed=7)
        state = _canonical(model.state_dict())
        assert set(state) == set(expected.tensors)
        before = {k: _raw(v) for k, v in state.items()}
        strict_load(model, ckpt_dir)
        loaded = _canonical(model.state_dict())
    changed = 0
    for name, tensor in loaded.items():
        meta = expected.tensors[name]
        want = b"".join(expected.read_chunks(name, 1 << 20))
        # megatron-core keeps norms and the router bias in fp32: the bf16 -> fp32 cast on load
        # is exact, so casting back must give the converted bytes.
        as_stored = tensor.to(getattr(torch, {"BF16": "bfloat16", "F32": "float32"}[meta.dtype]))
        assert _raw(as_stored) == want, name
        changed += before[name] != _raw(tensor)
    assert changed == len(loaded)
    assert any(n.startswith("mtp.layers.0.transformer_layer.") for n in loaded)


def test_qkv_interleave_means_the_same_attention(tmp_path: Path) -> None:
    hf = open_checkpoint(FIXTURES / "mimo")
    ckpt_dir = hf_to_megatron(hf, tmp_path / "megatron")
    from safetensors.torch import load_file

    weights = load_file(str(FIXTURES / "mimo" / "model.safetensors"))
    hidden = hf.config["hidden_size"]
    eye = torch.eye(hidden, dtype=torch.float32)
    with single_process_group():
        model = build_gpt_model(dict(hf.config), "mimo", seed=3)
        strict_load(model, ckpt_dir)
        model = model.float()
        for prefix, layer in (
            ("model.layers.1.", model.decoder.layers[1]),
            ("model.mtp_layers.0.", model.mtp.layers[0].transformer_layer),
        ):
            query, key, value = layer.self_attention.get_query_key_value_tensors(eye.unsqueeze(1))[
                :3
            ]
            for got, proj in ((query, "q_proj"), (key, "k_proj"), (value, "v_proj")):
                w = weights[f"{prefix}self_attn.{proj}.weight"].float()
                b = weights[f"{prefix}self_attn.{proj}.bias"].float()
                want = torch.nn.functional.linear(eye, w, b)
                assert torch.equal(got.reshape(hidden, -1), want), f"{prefix}{proj}"


def test_tensor_without_counterpart_is_refused_with_its_name(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    src = Path(shutil.copytree(FIXTURES / "qwen3_next", tmp_path / "src"))
    (src / "model.safetensors").rename(src / "model-00001-of-00002.safetensors")
    stray = {"model.layers.0.linear_attn.mystery.weight": torch.zeros(2, dtype=torch.bfloat16)}
    save_file(stray, str(src / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    with pytest.raises(
        InputError,
        match="1 tensor\\(s\\) have no Megatron counterpart: model.layers.0.linear_attn.mystery",
    ):
        hf_to_megatron(open_checkpoint(src), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_fp8_quantized_source_is_refused_as_quantized(tmp_path: Path) -> None:
    """DeepSeek's FP8 release layout: F8_E4M3 weights with one F32 ``weight_scale_inv`` per
    128x128 block (here one block per tensor); the scales have no place in megatron-core."""
    from safetensors.torch import load_file, save_file

    src = Path(shutil.copytree(FIXTURES / "deepseek_v3", tmp_path / "src"))
    [shard] = [p for p in sorted(src.glob("*.safetensors")) if "layers.0." in str(load_file(p))]
    weights = load_file(shard)
    quantized = 0
    for name in [
        n for n in weights if n.startswith("model.layers.0.mlp.") and n.endswith("proj.weight")
    ]:
        w = weights[name].float()
        scale = w.abs().max().clamp(min=1e-12) / 448.0
        weights[name] = (w / scale).to(torch.float8_e4m3fn)
        weights[name + "_scale_inv"] = scale.reshape(1, 1)
        quantized += 1
    save_file(weights, str(shard), metadata={"format": "pt"})
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"].update(dict.fromkeys(weights, shard.name))
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        InputError,
        match=f"the source is quantized: {quantized} tensor\\(s\\) are quantization parts "
        "\\(model.layers.0.mlp.",
    ):
        hf_to_megatron(open_checkpoint(src), tmp_path / "out")
    assert quantized and not (tmp_path / "out").exists()


def test_destination_must_be_empty(tmp_path: Path) -> None:
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="destination exists and is not empty"):
        hf_to_megatron(open_checkpoint(FIXTURES / "mimo"), dst)
    assert (dst / "keep.txt").read_text() == "mine"


def test_megatron_to_hf_copies_in_the_kernel_and_without_it_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plain copies and fc1's gate/up halves go file to file (``copy_file_range``); where the
    call is refused, reading and writing gives the same files."""
    import errno
    import os

    from mtpcheck.convert.builtin import megatron_to_hf
    from mtpcheck.formats.config_json import read_config

    hf = open_checkpoint(FIXTURES / "mimo")
    hf_to_megatron(hf, tmp_path / "megatron")
    megatron = open_checkpoint(tmp_path / "megatron")
    config = read_config(FIXTURES / "mimo" / "config.json")

    copied: list[int] = []
    real = os.copy_file_range

    def counting(src: int, dst: int, count: int, offset_src: int | None = None) -> int:
        copied.append(count)
        return real(src, dst, count, offset_src)

    monkeypatch.setattr(os, "copy_file_range", counting)
    fast = megatron_to_hf(megatron, tmp_path / "fast", config)

    def refused(*args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refused)
    slow = megatron_to_hf(megatron, tmp_path / "slow", config)

    assert [p.name for p in fast] == [p.name for p in slow]
    for a, b in zip(fast, slow, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name
    fc1_halves = [n for n in hf.tensors if n.endswith(("gate_proj.weight", "up_proj.weight"))]
    total = sum(m.nbytes for m in hf.tensors.values())
    in_kernel = sum(copied)
    computed = [n for n in hf.tensors if n.endswith(("q_proj.weight", "k_proj.weight"))]
    assert fc1_halves and in_kernel >= sum(hf.tensors[n].nbytes for n in fc1_halves)
    assert in_kernel <= total - sum(hf.tensors[n].nbytes for n in computed)
    assert open_checkpoint(tmp_path / "fast").tensors.keys() == hf.tensors.keys()


def test_two_writer_threads_and_kernel_copies_write_a_strictly_loadable_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the round trip's stage 1 runs: two ``.distcp`` files written at once, plain copies
    copied file to file (``copy_file_range``; the fixtures' tensors are below the size that
    earns a system call, so the threshold is lowered). megatron-core loads the result with
    ``RAISE_ALL`` and every tensor holds the mapped source's bytes."""
    import os

    from mtpcheck.convert import torch_dist_writer

    hf = open_checkpoint(FIXTURES / "mimo")
    expected = as_megatron(hf)
    copied: list[int] = []
    real = os.copy_file_range

    def counting(src: int, dst: int, count: int, *args: int) -> int:
        n = real(src, dst, count, *args)
        copied.append(n)
        return n

    monkeypatch.setattr(os, "copy_file_range", counting)
    monkeypatch.setattr(torch_dist_writer, "KERNEL_COPY_MIN", 1)
    ckpt_dir = hf_to_megatron(hf, tmp_path / "megatron", durable=False, writer_threads=2)

    assert sorted(p.name for p in ckpt_dir.glob("*.distcp")) == ["__0_0.distcp", "__0_1.distcp"]
    kinds = {n: m.kind for n, m in expected.plan.by_megatron().items()}
    plain = sum(expected.tensors[n].nbytes for n, k in kinds.items() if k is Kind.COPY)
    computed = sum(expected.tensors[n].nbytes for n, k in kinds.items() if k is Kind.QKV)
    total = sum(m.nbytes for m in expected.tensors.values())
    assert plain and computed
    assert plain <= sum(copied) <= total - computed  # every plain copy, nothing computed
    written = open_checkpoint(ckpt_dir)
    assert written.tensors.keys() == expected.tensors.keys()
    for name in expected.tensors:
        got = b"".join(written.read_chunks(name, 1 << 20))
        assert got == b"".join(expected.read_chunks(name, 1 << 20)), name
    with single_process_group():
        model = build_gpt_model(dict(hf.config), "mimo", seed=7)
        strict_load(model, ckpt_dir)


def test_a_tensor_made_by_two_writer_threads_at_once_keeps_one_map_registered() -> None:
    """Two threads asking for the same tensor at once may both map it; the map that goes
    unused leaves the registry (its address could be reused by a later map, whose bytes the
    writer would then copy from the wrong place)."""
    import threading

    from mtpcheck.convert.builtin import _OneAtATime
    from mtpcheck.convert.file_ranges import FileRanges, buffer_address

    view = as_megatron(open_checkpoint(FIXTURES / "mimo"))
    ranges = FileRanges()
    tensors = _OneAtATime(view, None, ranges)
    name = next(n for n, m in view.plan.by_megatron().items() if m.kind is Kind.COPY)
    made: list[memoryview] = []
    both = threading.Barrier(2)
    compute = tensors._compute

    def at_once(n: str) -> memoryview:
        raw = compute(n)
        made.append(raw)
        both.wait(timeout=10)
        return raw

    tensors._compute = at_once  # type: ignore[method-assign]
    given: list[memoryview] = []
    threads = [
        threading.Thread(target=lambda: given.append(tensors._acquire(name, None)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert len(made) == 2 and given[0] is given[1]
        (unused,) = [raw for raw in made if raw is not given[0]]
        size = len(given[0])
        assert ranges(buffer_address(given[0]), size) is not None
        assert ranges(buffer_address(unused), size) is None
    finally:
        ranges.close()
