"""``mtp-trained``: an MTP layer that was initialised or copied, not trained, is found.

The damaged layers are made by the libraries that make them in the wild: transformers'
``MtpModel`` (the drafter behind ``generate(use_mtp=True)``) built fresh, which is what a
loader that drops the stored MTP tensors ends up with, and megatron-core's own initialisation
of a ``GPTModel``'s MTP block.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES, Run

DATA = Path(__file__).resolve().parent / "data"
SHIPPED = sorted(
    (
        *(p for p in FIXTURES.iterdir() if (p / "config.json").exists()),
        *(p for p in (FIXTURES / "quantized").iterdir() if (p / "config.json").exists()),
        *(DATA / "megatron_bridge_062").glob("*/megatron"),  # Megatron-Bridge 0.6.2's output
        *(DATA / "megatron_bridge_062").glob("*/hf"),
        DATA / "megatron_lm_0192",  # Megatron-LM 0.19.2's own training save
    )
)


def _trained(run: Run) -> dict[str, Any]:
    report = json.loads(run.stdout)
    (check,) = [c for c in report["checks"] if c["name"].endswith(CheckName.MTP_TRAINED)]
    return check


@pytest.mark.parametrize(
    "fixture", SHIPPED, ids=[str(p.relative_to(p.parents[1])) for p in SHIPPED]
)
def test_no_shipped_checkpoint_is_called_untrained(run_cli, fixture: Path) -> None:
    check = _trained(run_cli("inspect", fixture, "--format", "json"))
    assert check["status"] in ("pass", "skip"), check


def _rewrite(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _fresh_mtp_model(fixture: Path, layer_kind: str) -> dict[str, Any]:
    """transformers' MtpModel for ``fixture``'s main model, as its constructor initialises
    it (``post_init``), by MtpModel's own names."""
    import torch
    import transformers
    from transformers.modeling_layers import MtpModel

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model = transformers.AutoModelForCausalLM.from_pretrained(fixture, dtype=torch.bfloat16)
    config = model.config.get_text_config()
    config.num_mtp_layers, config.mtp_layer_types = 1, [layer_kind]
    torch.manual_seed(0)
    return MtpModel(model, 1).state_dict()


QWEN_NAMES = {  # MtpModel's names -> Qwen3.5's checkpoint names (its weight conversions)
    "layers.0.enorm.weight": "mtp.pre_fc_norm_embedding.weight",
    "layers.0.hnorm.weight": "mtp.pre_fc_norm_hidden.weight",
    "layers.0.eh_proj.weight": "mtp.fc.weight",
    "layers.0.post_norm.weight": "mtp.norm.weight",
}


def test_a_freshly_initialised_layer_fails(run_cli, fixture_copy, tmp_path: Path) -> None:
    """A Qwen3.5 checkpoint whose MTP layer holds transformers' fresh initialisation: all
    seven norms at 1.0. inspect fails it, and roundtrip refuses it before converting."""
    import torch

    damaged = fixture_copy("qwen3_5_text")
    fresh = _fresh_mtp_model(damaged, "full_attention")
    renamed = {
        QWEN_NAMES.get(k, k.replace("layers.0.mtp_block.", "mtp.layers.0.")): v
        for k, v in fresh.items()
        if k not in ("embed_tokens.weight", "shared_head.weight")
    }

    def replace_mtp(tensors: dict[str, Any]) -> None:
        mtp = {k for k in tensors if k.startswith("mtp.")}
        assert mtp == set(renamed)  # the rename covers the layer exactly
        tensors.update({k: v.to(torch.bfloat16).contiguous() for k, v in renamed.items()})

    _rewrite(damaged / "model.safetensors", replace_mtp)
    run = run_cli("inspect", damaged, "--format", "json")
    assert run.exit_code == 1, run
    (finding,) = _trained(run)["findings"]
    assert finding["status"] == "fail"
    assert finding["message"] == (
        "all 7 norms hold their initial value (1.0 in every element: mtp.layers.0."
        "input_layernorm.weight, mtp.layers.0.post_attention_layernorm.weight, mtp.layers.0."
        "self_attn.k_norm.weight ...): the layer was initialised, not trained"
    )
    work = tmp_path / "work"
    roundtrip = run_cli("roundtrip", damaged, "--workdir", work, "--format", "json")
    assert roundtrip.exit_code == 1, roundtrip
    assert _trained(roundtrip)["status"] == "fail"
    assert not (work / "megatron").exists()  # refused before the first conversion


def test_a_block_copied_from_a_main_layer_fails(run_cli, fixture_copy) -> None:
    """DeepSeek-V3's MTP block filled from main layer 1 (both MoE layers)."""
    damaged = fixture_copy("deepseek_v3")
    index = json.loads((damaged / "model.safetensors.index.json").read_text())["weight_map"]
    moved = sorted(
        n for n in index if n.startswith("model.layers.2.self_attn.") and n.endswith("proj.weight")
    )

    def copy_attention(tensors: dict[str, Any], source: dict[str, Any]) -> None:
        for name in moved:
            if name in tensors:
                tensors[name] = source[name.replace("layers.2.", "layers.1.")].clone()

    from safetensors.torch import load_file

    everything: dict[str, Any] = {}
    for shard in sorted(set(index.values())):
        everything.update(load_file(str(damaged / shard)))
    for shard in sorted(set(index.values())):
        _rewrite(damaged / shard, lambda t: copy_attention(t, everything))
    run = run_cli("inspect", damaged, "--format", "json")
    assert run.exit_code == 1, run
    (finding,) = _trained(run)["findings"]
    assert finding["status"] == "fail"
    assert finding["details"]["copied_from"] == {
        n: n.replace("layers.2.", "layers.1.") for n in moved
    }
    assert finding["message"].startswith(
        f"{len(moved)} block tensor(s) byte-identical to a main layer's (model.layers.2."
    )


def test_fresh_projections_beside_trained_main_layers_warn(run_cli, fixture_copy) -> None:
    """The trained DeepSeek-V3 fixture with its MTP projections (attention, shared expert,
    eh_proj) replaced by transformers' initialisation, norms left trained: the statistics
    match ``initializer_range`` 0.02 where the main layers' do not; a warning, not a fail."""
    import torch

    damaged = fixture_copy("accept_deepseek_v3")
    fresh = _fresh_mtp_model(damaged, "full_attention")
    replaced = {
        k.replace("layers.0.mtp_block.", "model.layers.2.").replace(
            "layers.0.", "model.layers.2."
        ): v
        for k, v in fresh.items()
        if v.dim() == 2 and k.endswith("proj.weight") and ".experts." not in k
    }

    def replace_projections(tensors: dict[str, Any]) -> None:
        assert set(replaced) <= set(tensors)
        tensors.update({k: v.to(torch.bfloat16).contiguous() for k, v in replaced.items()})

    _rewrite(damaged / "model.safetensors", replace_projections)
    run = run_cli("inspect", damaged, "--format", "json")
    assert run.exit_code == 0, run  # a warning: the verdict stays PASS
    (finding,) = _trained(run)["findings"]
    assert finding["status"] == "warn"
    big = {n for n, v in replaced.items() if v.numel() >= 1024}
    assert set(finding["details"]["initialised_like"]) == big
    assert "std 0.02), unlike the main layers' (std " in finding["message"]


@pytest.mark.parametrize("experts", [(0,), (1, 2, 3)])
def test_only_the_first_routed_expert_is_judged(run_cli, fixture_copy, experts) -> None:
    """Routed experts past the first are many and alike: the check reads none of them. Fresh
    expert 0 warns by name; fresh experts 1 to 3 (of 4) are not read, so nothing is said."""
    import torch

    damaged = fixture_copy("accept_deepseek_v3")
    fresh = _fresh_mtp_model(damaged, "full_attention")
    # MtpModel leaves its packed routed experts uninitialised (torch.empty); its shared
    # expert, of the same shapes here (one expert's width), is drawn by the initialiser
    shared = "layers.0.mtp_block.mlp.shared_experts."
    replaced = {
        f"model.layers.2.mlp.experts.{e}.{proj}.weight": fresh[f"{shared}{proj}.weight"]
        for e in experts
        for proj in ("gate_proj", "up_proj", "down_proj")
    }

    def replace_experts(tensors: dict[str, Any]) -> None:
        assert set(replaced) <= set(tensors)
        tensors.update({k: v.to(torch.bfloat16).contiguous() for k, v in replaced.items()})

    _rewrite(damaged / "model.safetensors", replace_experts)
    run = run_cli("inspect", damaged, "--format", "json")
    assert run.exit_code == 0, run
    (finding,) = _trained(run)["findings"]
    if experts == (0,):
        assert finding["status"] == "warn"
        assert set(finding["details"]["initialised_like"]) == set(replaced)
    else:
        assert finding["status"] == "pass", finding


def test_megatron_cores_own_initialisation_fails(run_cli, tmp_path: Path) -> None:
    """DeepSeek-V3 converted by the built-in converter, then its MTP layer's bytes replaced
    on disk by what megatron-core's initialisation of the same GPTModel holds (a converter
    that builds the model and never loads the MTP weights saves exactly that)."""
    import torch

    from mtpcheck.convert.builtin import hf_to_megatron
    from mtpcheck.convert.torch_dist_writer import single_process_group
    from mtpcheck.formats import open_checkpoint
    from mtpcheck.formats.megatron_common import canonical_name
    from tests.megatron_models import build_gpt_model

    hf = open_checkpoint(FIXTURES / "deepseek_v3")
    ckpt_dir = hf_to_megatron(hf, tmp_path / "megatron")
    converted = open_checkpoint(ckpt_dir)
    with single_process_group():
        model = build_gpt_model(dict(hf.config), "deepseek_v3", seed=11, fill=False)
        initialised = {canonical_name(k): v for k, v in model.state_dict().items()}
    torch_dtype = {"BF16": torch.bfloat16, "F32": torch.float32}
    written = 0
    for name, meta in converted.tensors.items():
        if not name.startswith("mtp."):
            continue
        data = initialised[name].detach().to(torch_dtype[meta.dtype]).contiguous()
        raw = data.view(torch.uint8).numpy().tobytes()
        spans = converted.byte_spans(name)
        assert spans is not None and sum(s.length for s in spans) == len(raw)
        at = 0
        for span in spans:
            with open(span.file, "r+b") as f:
                f.seek(span.offset)
                f.write(raw[at : at + span.length])
            at += span.length
        written += 1
    assert written >= 20
    run = run_cli("inspect", ckpt_dir, "--format", "json")
    assert run.exit_code == 1, run
    (finding,) = _trained(run)["findings"]
    assert finding["status"] == "fail"
    assert finding["message"].startswith("all 7 norms hold their initial value (1.0 in every")
