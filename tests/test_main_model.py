"""The main model held to its config: each loss is built for real (the ``safetensors`` library
rewrites the shards, the index is rebuilt to match) and the exact finding asserted; no false
alarm on a shipped fixture, and every loss the check claims to see, seen. transformers' own
loader is held to it in tests/test_main_model_transformers.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from mtpcheck import CheckName
from mtpcheck.checks.main_model_checks import main_model_check
from mtpcheck.families import analyse
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES, Run
from tests.main_model_losses import layer_of, loss_is_named, main_tensors

INDEX = "model.safetensors.index.json"


def _rewrite_without(root: Path, drop: Callable[[str], bool]) -> list[str]:
    """Remove the tensors ``drop`` picks from every shard (the safetensors library loads and
    saves each shard) and from the index; returns the names removed."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    removed = []
    for shard in sorted(root.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            metadata = f.metadata()
        tensors = load_file(str(shard))
        gone = [n for n in tensors if drop(n)]
        if not gone:
            continue
        for n in gone:
            del tensors[n]
        removed += gone
        save_file(tensors, str(shard), metadata=metadata)
    index = root / INDEX
    if index.exists():
        content = json.loads(index.read_text())
        content["weight_map"] = {
            n: f for n, f in content["weight_map"].items() if n not in set(removed)
        }
        index.write_text(json.dumps(content))
    assert removed, "the damage removed nothing"
    return removed


def _main_findings(run: Run) -> list[tuple[str, str, str]]:
    report = json.loads(run.stdout)
    (check,) = [c for c in report["checks"] if c["name"] == CheckName.MAIN_MODEL]
    return [(f["status"], f["subject"], f["message"]) for f in check["findings"]]


def _failing_checks(run: Run) -> list[str]:
    return [c["name"] for c in json.loads(run.stdout)["checks"] if c["status"] == "fail"]


def _inspect(run_cli, path: Path) -> Run:
    return run_cli("inspect", path, "--format", "json")


# --- the losses of the issue, one by one -----------------------------------------------------


def built(family: str) -> str:
    """What a finding says built the layers a family's definition holds."""
    from mtpcheck.families.definitions import definition_of

    d = definition_of(family)
    assert d is not None
    return f"{d.source}'s {' / '.join(d.built_by)} builds a layer of this kind with them"


LOSSES = [
    # (fixture, the names dropped: a prefix ending in "." or one name, main-model's findings)
    pytest.param(
        "deepseek_v3",
        "model.layers.0.",
        [
            (
                "main layer 0 (dense)",
                "all its tensors missing (no tensor of this layer in the checkpoint)",
            )
        ],
        id="a-whole-layer-alone-of-its-kind",
    ),
    pytest.param(
        "qwen3_5_text",  # layers 0-2 gated delta net, 3 full attention
        "model.layers.0.",
        [
            (
                "main layer 0 (linear_attention)",
                "all 14 tensors missing (as main layer 1 of its kind holds them)",
            )
        ],
        id="a-whole-layer-its-kind-others-share",
    ),
    pytest.param(
        "deepseek_v3",
        "model.norm.weight",
        [("model.norm.weight", "missing: the final norm of the main model")],
        id="the-final-norm",
    ),
    pytest.param(
        "glm4_moe",
        "model.layers.1.mlp.experts.1.down_proj.weight",
        [("main layer 1 (moe)", "expert 1 of 4 lacks down_proj.weight")],
        id="one-projection-of-one-expert",
    ),
    pytest.param(
        "deepseek_v3",  # as mergekit's mergekit-yaml does: the router and shared expert stay
        "model.layers.1.mlp.experts.",
        [("main layer 1 (moe)", "no routed experts: the config makes it an MoE layer of 4")],
        id="every-routed-expert-of-a-layer",
    ),
    pytest.param(
        "qwen3_5_text",
        "model.layers.1.linear_attn.conv1d.weight",
        [
            (
                "main layer 1 (linear_attention)",
                f"1 tensor(s) its definition holds missing ({built('qwen3_5_text')}): "
                "model.layers.1.linear_attn.conv1d.weight",
            )
        ],
        id="one-tensor-its-kind-others-hold",
    ),
    pytest.param(
        "qwen3_5_text",  # a shard boundary inside a layer: its attention survived, its MLP not
        "model.layers.2.mlp.",
        [
            (
                "main layer 2 (linear_attention)",
                f"3 tensor(s) its definition holds missing ({built('qwen3_5_text')}): "
                "model.layers.2.mlp.down_proj.weight, model.layers.2.mlp.gate_proj.weight, "
                "model.layers.2.mlp.up_proj.weight",
            )
        ],
        id="a-whole-module-of-a-layer",
    ),
    pytest.param(
        "deepseek_v3",  # the one dense layer: its attention is still the MoE layers'
        "model.layers.0.self_attn.kv_b_proj.weight",
        [
            (
                "main layer 0 (dense)",
                f"1 tensor(s) its definition holds missing ({built('deepseek_v3')}): "
                "model.layers.0.self_attn.kv_b_proj.weight",
            )
        ],
        id="the-attention-of-a-layer-alone-of-its-kind",
    ),
]


@pytest.mark.parametrize(("fixture", "dropped", "findings"), LOSSES)
def test_a_main_model_loss_is_found_and_named(
    fixture_copy, run_cli, fixture: str, dropped: str, findings: list[tuple[str, str]]
) -> None:
    root = fixture_copy(fixture)
    if dropped.endswith("."):
        _rewrite_without(root, lambda n: n.startswith(dropped))
    else:
        _rewrite_without(root, lambda n: n == dropped)
    run = _inspect(run_cli, root)
    assert run.exit_code == 1, run
    assert _main_findings(run) == [("fail", subject, message) for subject, message in findings]
    assert _failing_checks(run) == ["main-model"]  # the MTP layer is whole, and said so


def test_a_main_layer_and_the_head_gone_blame_the_main_model(fixture_copy, run_cli) -> None:
    root = fixture_copy("deepseek_v3")
    _rewrite_without(root, lambda n: n.startswith("model.layers.1.") or n == "lm_head.weight")
    run = _inspect(run_cli, root)
    assert _main_findings(run) == [
        (
            "fail",
            "lm_head.weight",
            "missing: the output head (the config does not tie it) of the main model",
        ),
        (
            "fail",
            "main layer 1 (moe)",
            "all its tensors missing (no tensor of this layer in the checkpoint)",
        ),
    ]
    layers = json.loads(run.stdout)["checks"]
    (mtp,) = [c for c in layers if c["name"] == CheckName.MTP_LAYERS]
    # the MTP layer is whole: only the head it drafts through is missing, named as such
    assert [(f["status"], f["subject"]) for f in mtp["findings"]] == [
        ("pass", "mtp layer 0"),
        ("fail", "lm_head.weight"),
    ]


def test_a_tensor_of_another_shape_than_its_peers(fixture_copy, run_cli) -> None:
    from safetensors.torch import load_file, save_file

    root = fixture_copy("qwen3_5_text")
    name = "model.layers.1.linear_attn.out_proj.weight"
    shard = Path(open_checkpoint(root).tensors[name].file)
    tensors = load_file(str(shard))
    tensors[name] = tensors[name][:, :-2].contiguous()  # a converter that cut two columns
    save_file(tensors, str(shard), metadata={"format": "pt"})
    (finding,) = _main_findings(_inspect(run_cli, root))
    assert finding[:2] == ("fail", "main layer 1 (linear_attention)")
    assert finding[2].startswith("linear_attn.out_proj.weight has shape [32, ")
    assert finding[2].endswith("where its peers hold [32, " + finding[2].split("[32, ")[2])


def test_the_embedding_of_another_vocabulary(fixture_copy, run_cli) -> None:
    root = fixture_copy("qwen3_5_text")
    config = json.loads((root / "config.json").read_text())
    config["vocab_size"] += 1
    (root / "config.json").write_text(json.dumps(config))
    findings = _main_findings(_inspect(run_cli, root))
    vocab, hidden = config["vocab_size"], config["hidden_size"]
    assert [f[1] for f in findings] == ["model.embed_tokens.weight", "lm_head.weight"]
    assert findings[0][2] == (
        f"shape [{vocab - 1}, {hidden}], where the embedding of this config is "
        f"[{vocab}, {hidden}] (vocab_size, hidden_size)"
    )


def test_a_tied_head_is_not_required(fixture_copy, run_cli) -> None:
    root = fixture_copy("qwen3_5_text")
    _rewrite_without(root, lambda n: n == "lm_head.weight")
    config = json.loads((root / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (root / "config.json").write_text(json.dumps(config))
    ((status, subject, message),) = _main_findings(_inspect(run_cli, root))
    assert (status, subject) == ("pass", "main model")
    assert "embedding, final norm present" in message


def test_diff_judges_the_main_model_of_each_side(fixture_copy, run_cli) -> None:
    root = fixture_copy("glm4_moe")
    _rewrite_without(root, lambda n: n == "model.layers.0.input_layernorm.weight")
    run = run_cli("diff", FIXTURES / "glm4_moe", root, "--format", "json")
    assert run.exit_code == 1
    findings = _main_findings(run)
    assert findings[0][:2] == ("pass", "A: main model")
    assert findings[1:] == [
        (
            "fail",
            "B: main layer 0 (dense)",
            f"1 tensor(s) its definition holds missing ({built('glm4_moe')}): "
            "model.layers.0.input_layernorm.weight",
        )
    ]


def test_accept_refuses_a_checkpoint_without_its_whole_main_model(
    fixture_copy, run_cli, tmp_path: Path
) -> None:
    root = fixture_copy("accept_deepseek_v3")
    _rewrite_without(root, lambda n: n.startswith("model.layers.1.mlp.experts.3."))
    workload = tmp_path / "w.jsonl"
    workload.write_text(json.dumps({"text": "one two three"}) + "\n")
    run = run_cli("accept", root, "--workload", f"w={workload}")
    assert run.exit_code == 1, run
    assert run.stderr.strip().splitlines() == [
        f"mtpcheck: refused: {root}: not measured: main-model: main layer 1 (moe): 1 of 4 routed "
        f"experts missing: expert(s) 3 (`mtpcheck inspect {root}` lists every finding)"
    ]


# --- no false alarm, and what the check expects against transformers' own models ---------------


def _fixtures() -> list[str]:
    return sorted(p.parent.name for p in FIXTURES.glob("*/config.json"))


@pytest.mark.parametrize("name", _fixtures())
def test_every_shipped_fixture_passes(name: str) -> None:
    ckpt = open_checkpoint(FIXTURES / name)
    check = main_model_check(ckpt, analyse(ckpt.config, ckpt.tensors, ckpt.config_path))
    assert [f.status.value for f in check.findings] == ["pass"], check.findings


SHARED_KINDS = {
    "exaone4_5": (0, 1, 2),
    "exaone_moe": (1, 2),
    "mimo": (0, 1),
    "minimax_m2": (0, 1),
    "qwen3_5_moe": (0, 1, 2),
    "qwen3_5_text": (0, 1, 2),
}
"""Main layers that share their kind with another layer, so that each of their tensors is
held to the others'; every other layer of the fixtures is the only one of its kind, checked
for presence, its experts and its modules besides the MLP (as the PASS line says)."""
_PER_EXPERT = re.compile(r"\.experts\.\d+\.")


@pytest.mark.parametrize("name", _fixtures())
def test_each_lost_main_tensor_is_found(name: str) -> None:
    """Removing any one of the embedding, final norm, head or a routed expert's tensors from a
    shipped fixture, and any tensor of a layer that shares its kind, fails the check naming
    the tensor or its layer (names and shapes only: no bytes read)."""
    ckpt = open_checkpoint(FIXTURES / name)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    assert analysis.family is not None
    template = analysis.family.layout.main_layer_prefix
    shared = [f"main layer {k}" for k in SHARED_KINDS.get(name, ())]
    top, layers = main_tensors(ckpt, analysis)
    tried = [n for n in layers if _PER_EXPERT.search(n) or layer_of(n, template) in shared]
    missed = [n for n in (*top, *tried) if not loss_is_named(ckpt, analysis, n)]
    assert top and not missed, missed


def test_mergekit_drops_every_routed_expert_of_a_layer(run_cli) -> None:
    """mergekit 0.1.5's own mergekit-yaml output (tests/thirdparty/mergekit, NOTES.md there):
    MoE layer 1 kept its router and shared expert, not one routed expert; the MTP layer is gone
    while the config declares it."""
    merged = Path(__file__).resolve().parent / "data" / "mergekit" / "deepseek_v3-linear"
    run = _inspect(run_cli, merged)
    assert run.exit_code == 1, run
    assert _main_findings(run) == [
        ("fail", "main layer 1 (moe)", "no routed experts: the config makes it an MoE layer of 4")
    ]
    assert _failing_checks(run) == [CheckName.MAIN_MODEL, CheckName.MTP_COUNT, CheckName.MTP_LAYERS]
