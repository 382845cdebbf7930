"""``accept`` with several MTP layers chained (Step-3.7 ships three): per-depth acceptance.

The chain is checked against transformers' own ``MtpModel`` (depth after depth, both rules for
the hidden state passed on), the counts against drafts made here from the reference's states
and the checkpoint's own heads read with ``safetensors``, and the online k = 3 loop against
teacher forcing pass by pass.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from mtpcheck.accept.head import drafter_layouts
from mtpcheck.accept.loading import Drafter, open_drafter
from mtpcheck.accept.online import speculative_decode
from mtpcheck.accept.scoring import score_depths
from mtpcheck.accept.workloads import load_tokenizer, tokenise
from mtpcheck.families import ChainHidden, analyse
from mtpcheck.formats import open_checkpoint
from tests.conftest import FIXTURES
from tests.greedy_check import assert_main_model_greedy

TRAINED = FIXTURES / "accept_step3p7"
RANDOM = FIXTURES / "step3p7"


def _reference(fixture: Path, chain: ChainHidden) -> tuple[object, object]:
    """The main model and transformers' MtpModel over its three MTP layers. Pre-norm: the
    config switch with which MtpModel chains each layer's output before any norm."""
    import transformers
    from transformers.modeling_layers import MtpModel

    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    model = transformers.AutoModelForImageTextToText.from_pretrained(fixture, dtype=torch.float32)
    if chain is ChainHidden.PRE_NORM:
        model.config.get_text_config().chain_hidden_post_norm = False
    mtp = MtpModel.from_pretrained(model).eval()
    assert mtp.use_post_norm is (chain is ChainHidden.POST_NORM)
    return model.eval(), mtp


def _sequences(fixture: Path, count: int) -> list[list[int]]:
    path = fixture / "workloads" / "in_domain.jsonl"
    return [list(s) for s in tokenise("w", path, load_tokenizer(fixture), 512).sequences[:count]]


def _heads(fixture: Path) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(shared_head.norm, shared_head.head) weights of MTP layers 0..2, read directly."""
    with safe_open(fixture / "model.safetensors", "pt") as f:
        return [
            (
                f.get_tensor(f"model.layers.{n}.shared_head.norm.weight").float(),
                f.get_tensor(f"model.layers.{n}.shared_head.head.weight").float(),
            )
            for n in (2, 3, 4)
        ]


@pytest.mark.parametrize("chain", list(ChainHidden), ids=lambda c: c.value)
@pytest.mark.parametrize("fixture", [RANDOM, TRAINED], ids=["step3p7", "accept_step3p7"])
def test_chain_matches_transformers_mtp_model(fixture: Path, chain: ChainHidden) -> None:
    model, mtp = _reference(fixture, chain)
    if fixture is RANDOM:  # the untrained fixture has a 64-token vocabulary
        ids = torch.randint(4, 64, (2, 24), generator=torch.Generator().manual_seed(0))
    else:
        ids = torch.tensor(_sequences(fixture, 3))
    drafter = open_drafter(fixture, dtype="float32", chain=chain)
    assert isinstance(drafter, Drafter) and drafter.chain.depths == 3
    window = model.config.get_text_config().sliding_window
    assert ids.shape[1] > window + 3  # every depth's sliding window is exercised
    length = ids.shape[1]
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[-1]
        positions = torch.arange(length).expand(ids.shape[0], -1)
        reference, ours = hidden, hidden
        for j in range(1, 4):
            reference = mtp.forward_layer(
                j - 1, reference[:, : length - j], positions[:, j:], None, input_ids=ids[:, j:]
            )
            _, ours = drafter.chain.step(j, ours[:, : length - j], ids[:, j:])
            assert float((ours - reference).abs().max()) < 1e-4, f"depth {j}"


def test_sliding_window_is_part_of_the_match() -> None:
    """Dropping the MTP layers' sliding window breaks the agreement with the reference, so the
    agreement above is not blind to it."""
    model, mtp = _reference(TRAINED, ChainHidden.PRE_NORM)
    ids = torch.tensor(_sequences(TRAINED, 2))
    drafter = open_drafter(TRAINED, dtype="float32")
    assert isinstance(drafter, Drafter)
    head = drafter.chain.heads[0]
    assert head.window == model.config.get_text_config().sliding_window == 16
    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states[-1]
        positions = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
        reference = mtp.forward_layer(
            0, hidden[:, :-1], positions[:, 1:], None, input_ids=ids[:, 1:]
        )
        windowed = head.block_output(hidden[:, :-1], ids[:, 1:])
        head.window = None
        unwindowed = head.block_output(hidden[:, :-1], ids[:, 1:])
    assert float((windowed - reference).abs().max()) < 1e-4
    assert float((unwindowed - reference).abs().max()) > 1e-2


def test_per_depth_counts_equal_drafts_made_from_the_reference(run_cli) -> None:
    """The JSON per-depth figures are the leading-hit counts of drafts made here: transformers'
    MtpModel states (pre-norm chain, the family's rule) through each layer's own stored head."""
    sequences = _sequences(TRAINED, 32)
    model, mtp = _reference(TRAINED, ChainHidden.PRE_NORM)
    heads = _heads(TRAINED)
    eps = model.config.get_text_config().rms_norm_eps
    leading_counts = [0, 0, 0]
    positions = 0
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq])
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
            main = out.logits[0].argmax(-1)
            length = ids.shape[1]
            slots = length - 3
            positions += slots
            state = out.hidden_states[-1]
            all_hit = torch.ones(slots, dtype=torch.bool)
            pos = torch.arange(length)[None]
            for j in range(1, 4):
                state = mtp.forward_layer(
                    j - 1, state[:, : length - j], pos[:, j:], None, input_ids=ids[:, j:]
                )
                norm_w, head_w = heads[j - 1]
                x = state[0].float()
                normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + norm_w)
                draft = (normed @ head_w.T).argmax(-1)
                all_hit &= (draft == main[j:length])[:slots]
                leading_counts[j - 1] += int(all_hit.sum())
    workload = TRAINED / "workloads" / "in_domain.jsonl"
    result = run_cli(
        "accept", str(TRAINED), "--temperature", "0", "--workload", f"in_domain={workload}",
        "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    [accepted] = json.loads(result.stdout)["acceptance"]
    chain = accepted["chain"]
    assert chain["hidden"] == "pre-norm"
    assert chain["positions"] == positions
    for depth, count in zip(chain["depths"], leading_counts, strict=True):
        assert round(depth["greedy"] * positions) == count
        assert depth["alpha"] == depth["greedy"]  # T = 0
    # the trained chain earns its keep in domain: every depth accepted most of the time
    assert chain["depths"][2]["greedy"] > 0.85
    assert chain["tokens_per_pass"] == pytest.approx(1 + sum(leading_counts) / positions)
    assert chain["depths"][1]["tokens_per_pass"] == pytest.approx(
        1 + (leading_counts[0] + leading_counts[1]) / positions
    )


@pytest.fixture(scope="module")
def trained() -> Drafter:
    drafter = open_drafter(TRAINED, dtype="float32")
    assert isinstance(drafter, Drafter)
    return drafter


def test_online_k3_equals_teacher_forced_pass_by_pass(trained: Drafter) -> None:
    prompts = [s[:9] for s in _sequences(TRAINED, 12)]
    decoded = speculative_decode(trained, prompts, new_tokens=30, temperature=0.0)
    assert decoded.k == 3
    taken = [d.depth_accepted for d in decoded.drafts]
    assert 3 in taken and min(taken) < 3  # full and cut-short runs both happen
    scored = score_depths(trained, decoded.sequences, 0.0)
    for d in decoded.drafts:
        run = 0
        for j in range(3):
            hits, _ = scored[d.sequence][j]
            if d.slot >= len(hits) or not bool(hits[d.slot]):
                break
            run += 1
        assert run == d.depth_accepted, d
    # speculative greedy decoding with k = 3 reproduces the main model's greedy continuation
    assert_main_model_greedy(trained.model, prompts, decoded.sequences)


def test_sampled_k3_uses_the_teacher_forced_alphas(trained: Drafter) -> None:
    """At T=0.6 each depth's acceptance probability is the teacher-forced alpha at its slot."""
    prompts = [s[:9] for s in _sequences(TRAINED, 8)]
    decoded = speculative_decode(trained, prompts, new_tokens=20, temperature=0.6, seed=1)
    scored = score_depths(trained, decoded.sequences, 0.6)
    checked = 0
    for d in decoded.drafts:
        assert 1 <= len(d.alphas) <= 3 and d.depth_accepted <= len(d.alphas)
        for j, alpha in enumerate(d.alphas):
            teacher = scored[d.sequence][j][1]
            if d.slot < len(teacher):
                assert abs(float(teacher[d.slot]) - alpha) < 1e-5
                checked += 1
    assert checked > 2 * len(decoded.drafts)  # deeper drafts were checked too


def test_online_report_and_depth_limits(run_cli) -> None:
    workload = TRAINED / "workloads" / "in_domain.jsonl"
    args = ("accept", str(TRAINED), "--temperature", "0", "--workload", f"in_domain={workload}")
    # the training rule: every depth over every slot, as the teacher-forced chain scores
    training = ("--online", "--draft-rule", "training")
    result = run_cli(*args, *training, "--new-tokens", "24", "--format", "json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    [online] = report["online_acceptance"]
    assert online["k"] == 3 and online["agreeing"] == online["drafts"]
    per_depth = online["accepted_per_position"]
    assert per_depth[0] >= per_depth[1] >= per_depth[2] > 0
    assert online["accepted_tokens"] == sum(per_depth)  # drafts accepted at every depth
    assert online["tokens_per_pass"] == pytest.approx(1 + sum(per_depth) / online["drafts"])
    assert online["teacher_forced_per_depth"] == pytest.approx(
        [n / online["drafts"] for n in per_depth]
    )
    three = report["acceptance"][0]
    # --depths 2 chains the first two layers: the same figures for those depths
    two = json.loads(run_cli(*args, "--depths", "2", "--format", "json").stdout)["acceptance"][0]
    assert len(two["chain"]["depths"]) == 2
    assert two["chain"]["positions"] > three["chain"]["positions"]  # one more slot a sequence
    # --depths 1 is the single-layer measurement, with no chain
    one = json.loads(run_cli(*args, "--depths", "1", "--format", "json").stdout)["acceptance"][0]
    assert one["chain"] is None and one["greedy"] == three["greedy"]
    table = run_cli(*args, *training, "--new-tokens", "12").stdout
    assert "MTP acceptance by depth (chained, pre-norm hidden state" in table
    assert "draft-then-verify, training rule, k=3" in table


@pytest.mark.parametrize(
    ("fixture", "depths", "layers"), [("accept_deepseek_v3", 2, 1), ("accept_step3p7", 4, 3)]
)
def test_more_depths_than_layers_is_refused_not_measured_as_fewer(
    fixture: str, depths: int, layers: int, run_cli
) -> None:
    """--depths beyond the layers the chain can draft is exit 2, never a silent k = 1."""
    path = FIXTURES / fixture
    workload = path / "workloads" / "in_domain.jsonl"
    run = run_cli("accept", path, "--workload", f"w={workload}", "--depths", str(depths))
    assert run.exit_code == 2, run
    assert run.stdout == ""
    assert run.stderr.strip() == (
        f"mtpcheck: error: {path}: --depths {depths}: the checkpoint has {layers} complete MTP "
        "layer(s) to chain, one a depth in the teacher-forced chain and under the training "
        "rule (--online with vLLM's draft rule, the default, reuses them for deeper drafts, "
        "as vLLM does)"
    )


def test_a_lost_middle_layer_shortens_the_chain(tmp_path: Path) -> None:
    """Layer 1 of 3 loses a tensor: depth 1 still drafts, the chain stops before the gap."""
    from safetensors.torch import load_file, save_file

    copy = tmp_path / "lost"
    shutil.copytree(TRAINED, copy)
    tensors = load_file(copy / "model.safetensors")
    del tensors["model.layers.3.eh_proj.weight"]
    save_file(tensors, copy / "model.safetensors", metadata={"format": "pt"})
    ckpt = open_checkpoint(copy)
    layouts = drafter_layouts(ckpt, analyse(ckpt.config, ckpt.tensors, ckpt.config_path))
    assert not isinstance(layouts, str)
    assert [layout.prefix for layout in layouts] == ["model.layers.2."]
