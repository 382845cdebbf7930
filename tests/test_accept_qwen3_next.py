"""The second trained fixture: Qwen3-Next's MTP layout (top-level ``mtp.`` block, no count key,
gated attention, a gated-delta-net main layer), trained on the same phrase language as
``accept_deepseek_v3`` by ``fixtures/make_accept_fixture_qwen3_next.py``."""

from __future__ import annotations

from mtpcheck.accept.options import AcceptOptions
from mtpcheck.accept.runner import run_accept
from tests.conftest import FIXTURES

FIXTURE = FIXTURES / "accept_qwen3_next"
WORKLOADS = tuple((n, FIXTURE / "workloads" / f"{n}.jsonl") for n in ("in_domain", "shuffled"))
CHANCE = 1 / 96


def test_trained_qwen3_next_drafter_earns_its_keep_in_domain_only() -> None:
    report = run_accept(AcceptOptions(FIXTURE, WORKLOADS, temperature=0.0, online=True))
    rows = {r.workload: r for r in report.acceptance}
    assert [i.family for i in report.inputs] == ["qwen3_next"]
    assert report.inputs[0].declared_by.startswith("no count key")  # as released
    assert rows["in_domain"].greedy.value > 0.9 and rows["in_domain"].positions == 32 * 63
    assert CHANCE < rows["shuffled"].greedy.value < rows["in_domain"].greedy.value - 0.5
    for online in report.online:  # draft-then-verify decoding agrees position by position
        assert online.agreeing == online.drafts > 600
        assert online.online == online.teacher_forced
    assert report.ok
