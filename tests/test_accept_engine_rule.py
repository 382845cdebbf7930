"""``accept --online --draft-rule engine`` drafts as vLLM does, checked against what vLLM 0.32
(CPU build) itself counted on the trained fixtures: ``tests/thirdparty/vllm/results/*.json``,
written by ``tests/thirdparty/vllm/run_vllm.py`` (greedy, the first 9 tokens of each document,
40 new tokens)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtpcheck.accept.engine_rule import engine_decode
from mtpcheck.accept.loading import Drafter, open_drafter
from mtpcheck.families import FAMILY_BY_NAME
from tests.conftest import FIXTURES

VLLM = Path(__file__).resolve().parent / "thirdparty" / "vllm" / "results"
DEEPSEEK = FIXTURES / "accept_deepseek_v3"
STEP = FIXTURES / "accept_step3p7"


def _vllm(name: str) -> dict:
    return json.loads((VLLM / f"{name}.json").read_text())


def _decode(drafter: Drafter, prompts: list[list[int]], k: int):
    family = FAMILY_BY_NAME[drafter.family]
    return engine_decode(
        drafter,
        prompts,
        40,
        k,
        family.serving.first_state,
        family.serving.zeroes_position0,
        bool(family.layout.copies),
    )


@pytest.fixture(scope="module")
def deepseek() -> Drafter:
    drafter = open_drafter(DEEPSEEK, dtype="float32")
    assert isinstance(drafter, Drafter)
    return drafter


@pytest.fixture(scope="module")
def step() -> Drafter:
    drafter = open_drafter(STEP, dtype="float32")
    assert isinstance(drafter, Drafter)
    return drafter


@pytest.mark.parametrize(
    ("which", "result", "k"),
    [
        ("deepseek", "deepseek_v3_k1", 1),  # one MTP layer, reused for k > 1
        ("deepseek", "deepseek_v3_k2", 2),
        ("deepseek", "deepseek_v3_k3", 3),
        ("step", "step3p7_k3", 3),  # three layers, each with its own cache and head
    ],
)
def test_drafts_as_vllm_did_pass_by_pass(which: str, result: str, k: int, request) -> None:
    drafter = request.getfixturevalue(which)
    vllm = _vllm(result)
    assert (vllm["vllm_version"], vllm["draft_tokens_k"], vllm["temperature"]) == ("0.32.0", k, 0.0)
    requests = vllm["requests"]
    decoded = _decode(drafter, [r["prompt"] for r in requests], k)
    for i, req in enumerate(requests):
        generated = decoded.sequences[i][len(req["prompt"]) :][: len(req["generated"])]
        assert generated == req["generated"], i
        histogram = [0] * (k + 1)
        for d in decoded.drafts:
            if d.sequence == i:
                histogram[d.depth_accepted] += 1
        assert histogram == req["spec_decode"]["acceptance_histogram"], i
    per_depth = [sum(d.depth_accepted > j for d in decoded.drafts) for j in range(k)]
    assert (len(decoded.drafts), per_depth) == (vllm["drafts"], vllm["accepted_per_pos"])


def test_unwritten_cache_slots_count_as_zero_keys_and_values(step: Drafter, monkeypatch) -> None:
    """Step-3.7's depths 2 and 3 write one position a step; vLLM attends to the slots they never
    wrote as zeros. Attending to the written positions only misses vLLM's counts."""
    import torch

    import mtpcheck.accept.engine_rule as rule

    def written_only(head, entries, upto):
        positions = sorted(p for p in entries if p <= upto)
        x = torch.stack([entries[p] for p in positions])[None]
        pos = torch.tensor(positions)
        return head.run_block(x, pos[None], rule._mask(pos, x.dtype, head.window))[0, -1]

    vllm = _vllm("step3p7_k3")
    monkeypatch.setattr(rule, "_block", written_only)
    decoded = _decode(step, [r["prompt"] for r in vllm["requests"]], 3)
    per_depth = [sum(d.depth_accepted > j for d in decoded.drafts) for j in range(3)]
    assert (len(decoded.drafts), per_depth) == (342, [338, 310, 306])  # vLLM: 341, [337, 312, 308]


def test_cli_reports_vllms_counters(run_cli) -> None:
    vllm = _vllm("deepseek_v3_k3")
    workload = DEEPSEEK / "workloads" / "in_domain.jsonl"
    args = ("accept", DEEPSEEK, "--workload", f"d={workload}", "--temperature", "0", "--online")
    run = run_cli(*args, "--draft-rule", "engine", "--depths", "3", "--format", "json")
    assert run.exit_code == 0, run
    [online] = json.loads(run.stdout)["online_acceptance"]
    assert (online["k"], online["drafts"], online["accepted_per_position"]) == (
        3,
        vllm["drafts"],
        vllm["accepted_per_pos"],
    )
    assert online["tokens_per_pass"] == pytest.approx(vllm["mean_acceptance_length"])
    assert online["draft_rule"] == "engine"
    training = run_cli(*args, "--draft-rule", "training", "--depths", "3", "--format", "json")
    assert training.exit_code == 2  # one layer: the training rule chains one depth
    table = run_cli(*args, "--depths", "2").stdout  # the engine rule is the default
    assert "draft-then-verify, vLLM's draft rule, k=2" in table


def test_sampled_engine_rule_accepts_argmax_drafts_with_p_of_the_draft(deepseek) -> None:
    """T > 0: drafts are still argmax (vLLM's default draft_sample_method), accepted with
    p_T(draft); every verify step's figure is the teacher-forced p_T(argmax q) at its slot."""
    from mtpcheck.accept.scoring import score_depths

    prompts = [r["prompt"] for r in _vllm("deepseek_v3_k1")["requests"]][:8]
    family = FAMILY_BY_NAME[deepseek.family]
    decoded = engine_decode(
        deepseek, prompts, 24, 1, family.serving.first_state, family.serving.zeroes_position0,
        True, temperature=0.8, seed=3,
    )  # fmt: skip
    scored = score_depths(deepseek, decoded.sequences, 0.8, argmax_drafts=True)
    checked = 0
    for d in decoded.drafts:
        hits, alphas = scored[d.sequence][0]
        if d.slot < len(alphas):
            assert abs(float(alphas[d.slot]) - d.alphas[0]) < 1e-5
            checked += 1
    assert checked > 100
    assert any(not d.accepted for d in decoded.drafts)  # sampled: some rejections happen
    assert 0 < min(d.alphas[0] for d in decoded.drafts) < max(d.alphas[0] for d in decoded.drafts)


def test_stored_copies_that_differ_are_served_with_the_main_ones(tmp_path: Path, run_cli) -> None:
    """vLLM shares the target's embedding and head with an MTP layer that stores copies of
    them: a checkpoint whose copy of the head was damaged still drafts as vLLM counted, while
    the teacher-forced figure, which uses the stored copy, falls."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    copy = Path(shutil.copytree(DEEPSEEK, tmp_path / "copy"))
    name = "model.layers.2.shared_head.head.weight"
    for shard in sorted(copy.glob("*.safetensors")):
        tensors = load_file(shard)
        if name in tensors:
            tensors[name] = torch.flip(tensors[name], dims=[0]).contiguous()
            save_file(tensors, str(shard), metadata={"format": "pt"})
    workload = copy / "workloads" / "in_domain.jsonl"
    args = ("accept", copy, "--workload", f"d={workload}", "--temperature", "0", "--online")
    run = run_cli(*args, "--draft-rule", "engine", "--format", "json")
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    [online] = report["online_acceptance"]
    # vLLM's counts, unchanged
    assert (online["drafts"], online["accepted_per_position"], online["accepted_tokens"]) == (
        643, [633], 633,
    )  # fmt: skip
    assert report["acceptance"][0]["greedy"] < 0.2  # the stored, damaged head drafts nothing
