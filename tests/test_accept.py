"""Honesty checks of ``mtpcheck accept`` on the trained DeepSeek-V3 fixture.

fixtures/make_accept_fixture.py trains the fixture's main model and MTP layer with
transformers' own ``MtpLayer``; mtpcheck reads the checkpoint back with its own reader and
head. The tests show that the acceptance it reports is the real thing: high in-domain, low on
shuffled tokens, equal to what a draft-then-verify loop measures online, unchanged by a
bit-exact round trip, and zero when ``save_pretrained`` drops the MTP layer.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from mtpcheck.accept.head import hidden_and_logits
from mtpcheck.accept.loading import Drafter, open_drafter
from mtpcheck.accept.online import speculative_decode
from mtpcheck.accept.options import AcceptOptions
from mtpcheck.accept.runner import run_accept
from mtpcheck.accept.scoring import score_batch
from mtpcheck.accept.workloads import load_tokenizer, tokenise
from mtpcheck.model import AcceptanceResult, Estimate, Status
from tests.conftest import FIXTURES
from tests.greedy_check import assert_main_model_greedy

FIXTURE = FIXTURES / "accept_deepseek_v3"
WORKLOADS = (
    ("in_domain", FIXTURE / "workloads" / "in_domain.jsonl"),
    ("shuffled", FIXTURE / "workloads" / "shuffled.jsonl"),
)
VOCAB = 96
CHANCE = 1 / VOCAB


@pytest.fixture(scope="module")
def drafter() -> Drafter:
    loaded = open_drafter(FIXTURE)
    assert isinstance(loaded, Drafter), loaded
    return loaded


@pytest.fixture(scope="module")
def sequences() -> dict[str, tuple[tuple[int, ...], ...]]:
    tokenizer = load_tokenizer(FIXTURE)
    return {name: tokenise(name, path, tokenizer, 512).sequences for name, path in WORKLOADS}


@pytest.fixture(scope="module")
def results() -> dict[str, AcceptanceResult]:
    report = run_accept(AcceptOptions(FIXTURE, WORKLOADS))
    return {r.workload: r for r in report.acceptance}


def small_workloads(tmp_path: Path, lines: int = 6) -> tuple[tuple[str, Path], ...]:
    """The fixture's workloads cut to their first ``lines`` sequences."""
    out = []
    for name, path in WORKLOADS:
        small = tmp_path / f"{name}.jsonl"
        small.write_text("".join(path.read_text().splitlines(keepends=True)[:lines]))
        out.append((name, small))
    return tuple(out)


def test_in_domain_acceptance_is_high_and_shuffled_is_lower(results) -> None:
    ind, shuf = results["in_domain"], results["shuffled"]
    for r in (ind, shuf):
        assert r.drafter and r.sequences == 32 and r.positions == 32 * 63
        assert r.tokens_per_pass == pytest.approx(1 + r.alpha.value)
        assert r.greedy.low < r.greedy.value < r.greedy.high
        assert r.alpha.low < r.alpha.value < r.alpha.high
    # far above chance (1/96) in-domain, and clearly lower on the same words shuffled
    assert ind.greedy.low > 0.9 and ind.alpha.low > 0.85
    assert ind.greedy.value > 50 * CHANCE
    assert shuf.greedy.high < 0.4 and shuf.alpha.high < 0.45
    assert ind.greedy.low > shuf.greedy.high + 0.4
    assert ind.alpha.low > shuf.alpha.high + 0.4


@torch.no_grad()
def test_shifted_target_control_collapses(drafter, sequences) -> None:
    """Scoring q_t against p_{t+2} (one step too far) must lose almost all agreement."""
    hits = right = total = 0
    for ids in sequences["in_domain"][:8]:
        x = torch.tensor([ids])
        hidden, logits = hidden_and_logits(drafter.model, x)
        q = drafter.head(hidden[:, :-1], x[:, 1:])[0]
        right += int((q.argmax(-1) == logits[0, 1:].argmax(-1)).sum())
        hits += int((q[:-1].argmax(-1) == logits[0, 2:].argmax(-1)).sum())
        total += len(ids) - 2
    assert right / total > 0.9
    assert hits / total < 0.15


@pytest.mark.parametrize("name", ["accept_deepseek_v3", "glm4_moe"])
@torch.no_grad()
def test_head_equals_transformers_own_mtp_layer(name: str) -> None:
    """Same weights, same logits as transformers' MtpLayer, with the weights loaded by
    transformers itself (the MTP block as layer N of an (N+1)-layer model)."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_layers import MtpLayer
    from transformers.utils import logging as hf_logging

    path = FIXTURES / name
    drafter = open_drafter(path)
    assert isinstance(drafter, Drafter)
    n = json.loads((path / "config.json").read_text())["num_hidden_layers"]
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        longer = AutoModelForCausalLM.from_pretrained(
            path, num_hidden_layers=n + 1, dtype=torch.float32
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    theirs = longer.get_decoder().layers[n].state_dict()
    ours = drafter.head.block.state_dict()
    assert sorted(theirs) == sorted(ours)
    for key, value in theirs.items():
        assert torch.equal(value, ours[key]), key

    model, head = drafter.model, drafter.head
    decoder = model.get_decoder()
    mtp = MtpLayer(model.config.get_mtp_config(), type(decoder.layers[-1]), type(decoder.norm), 0)
    mtp.load_state_dict(
        {
            "enorm.weight": head.enorm.weight,
            "hnorm.weight": head.hnorm.weight,
            "eh_proj.weight": head.eh_proj.weight,
            "post_norm.weight": head.final_norm.weight,
            **{f"mtp_block.{k}": v for k, v in theirs.items()},
        }
    )
    mtp.eval()
    ids = torch.tensor([[1, *range(5, 40)]])
    hidden, _ = hidden_and_logits(model, ids)
    embeds = model.get_input_embeddings()(ids[:, 1:])
    # transformers' MtpModel puts slot t at position t+1; ours at t (RoPE sees differences)
    positions = torch.arange(1, ids.shape[1])[None]
    length = positions.shape[1]
    mask = torch.full((length, length), torch.finfo(torch.float32).min).triu(1)[None, None]
    out = mtp(
        embeds,
        hidden[:, :-1],
        position_embeddings=decoder.rotary_emb(embeds, positions),
        attention_mask=mask,
        position_ids=positions,
        cache=None,
    )
    expected = model.get_output_embeddings()(out)
    torch.testing.assert_close(head(hidden[:, :-1], ids[:, 1:]), expected, atol=1e-5, rtol=1e-5)


def test_greedy_draft_then_verify_equals_teacher_forced(drafter, sequences) -> None:
    prompts = [list(s[:12]) for s in sequences["in_domain"][:10]]
    prompts += [list(s[:12]) for s in sequences["shuffled"][:10]]
    decoded = speculative_decode(drafter, prompts, new_tokens=36, temperature=0.0)
    assert len(decoded.drafts) > 300
    accepted = [d.accepted for d in decoded.drafts]
    assert 0 < accepted.count(False) < len(accepted)  # both verdicts happen
    scored = score_batch(drafter, decoded.sequences, 0.0)
    teacher = [bool(scored[d.sequence][0][d.slot]) for d in decoded.drafts]
    assert teacher == accepted  # position by position
    assert sum(teacher) / len(teacher) == decoded.online_rate()
    # speculative greedy decoding reproduces the main model's own greedy continuation
    assert_main_model_greedy(drafter.model, prompts, decoded.sequences)


def test_sampled_draft_then_verify_agrees_within_one_point(drafter, sequences) -> None:
    """Speculative sampling at T=0.6 (DeepSeek-R1's recommended temperature).

    The online acceptance rate is a random estimate of the mean teacher-forced alpha over the
    drafted positions; about 4,000 drafts put 1 percentage point at more than 3 standard
    deviations.
    """
    docs = sequences["in_domain"]
    prompts = [[1, *docs[i % 32][1 + (i // 32) * 5 : 4 + (i // 32) * 5]] for i in range(320)]
    decoded = speculative_decode(drafter, prompts, new_tokens=24, temperature=0.6, seed=0)
    drafts = decoded.drafts
    assert len(drafts) > 3500
    scored = score_batch(drafter, decoded.sequences, 0.6)
    teacher = [float(scored[d.sequence][1][d.slot]) for d in drafts]
    # the teacher-forced alpha at each drafted slot is the acceptance probability the loop used
    assert max(abs(t - d.alpha) for t, d in zip(teacher, drafts, strict=True)) < 1e-5
    expected = sum(teacher) / len(teacher)
    spread = math.sqrt(sum(a * (1 - a) for a in teacher))
    assert 0.01 > 3 * spread / len(teacher)  # enough positions for a 1-point claim
    assert abs(decoded.online_rate() - expected) < 0.01


def test_bit_exact_roundtrip_leaves_acceptance_unchanged(tmp_path: Path) -> None:
    from mtpcheck.checks.diff_checks import diff_report
    from mtpcheck.convert.builtin import hf_to_megatron, megatron_to_hf
    from mtpcheck.formats import open_checkpoint

    hf_to_megatron(open_checkpoint(FIXTURE), tmp_path / "megatron")
    config = json.loads((FIXTURE / "config.json").read_text())
    megatron_to_hf(open_checkpoint(tmp_path / "megatron"), tmp_path / "back", config)
    diff = diff_report(open_checkpoint(FIXTURE), open_checkpoint(tmp_path / "back"), True)
    assert diff.ok
    report = run_accept(
        AcceptOptions(FIXTURE, small_workloads(tmp_path), compare=tmp_path / "back")
    )
    a = [r for r in report.acceptance if r.checkpoint == str(FIXTURE)]
    b = [r for r in report.acceptance if r.checkpoint != str(FIXTURE)]
    assert len(a) == len(b) == 2 and all(r.drafter for r in a + b)
    for ra, rb in zip(a, b, strict=True):
        assert dataclasses.replace(rb, checkpoint=ra.checkpoint) == ra  # identical numbers
    for d in report.acceptance_deltas:
        assert (d.greedy.value, d.alpha.value, d.tokens_per_pass) == (0.0, 0.0, 0.0)
    assert report.ok


def test_save_pretrained_drops_the_drafter(tmp_path: Path) -> None:
    from transformers import DeepseekV3ForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        DeepseekV3ForCausalLM.from_pretrained(FIXTURE).save_pretrained(tmp_path / "saved")
    finally:
        hf_logging.set_verbosity(verbosity)
    workloads = small_workloads(tmp_path)
    report = run_accept(AcceptOptions(FIXTURE, workloads, compare=tmp_path / "saved"))
    saved = [r for r in report.acceptance if r.checkpoint == str(tmp_path / "saved")]
    assert len(saved) == 2
    for r in saved:
        assert not r.drafter
        assert (r.greedy.value, r.alpha.value, r.tokens_per_pass) == (0.0, 0.0, 1.0)
        assert r.positions > 0
        assert "no MTP weights" in r.note and "declares 1" in r.note
    original = {r.workload: r for r in report.acceptance if r.checkpoint == str(FIXTURE)}
    for d in report.acceptance_deltas:
        assert d.alpha.value == pytest.approx(-original[d.workload].alpha.value)
    for check in report.checks:
        assert [f.status for f in check.findings] == [Status.PASS, Status.FAIL, Status.INFO]
        assert check.findings[1].message.endswith("; the config declares 1 MTP layer(s)")
    # the config still promises a drafter: that fails the gate, --min-acceptance or not
    assert not report.ok
    gated = run_accept(
        AcceptOptions(FIXTURE, workloads[:1], compare=tmp_path / "saved", min_acceptance=0.5)
    )
    assert not gated.ok
    assert [f.status for f in gated.checks[0].findings] == [Status.PASS, Status.FAIL, Status.INFO]


@pytest.mark.parametrize(
    ("declared", "status"), [(None, Status.WARN), (0, Status.WARN), (1, Status.FAIL)]
)
def test_no_drafter_fails_only_when_the_config_declares_one(
    declared: int | None, status: Status
) -> None:
    from mtpcheck.accept.gating import finding as _finding

    r = AcceptanceResult(
        checkpoint="ckpt",
        workload="w",
        drafter=False,
        note="no MTP weights",
        sequences=2,
        positions=10,
        greedy_hits=0,
        greedy=Estimate(0.0),
        alpha=Estimate(0.0),
        tokens_per_pass=1.0,
        temperature=1.0,
    )
    assert _finding(r, None, declared).status is status
