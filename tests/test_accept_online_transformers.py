"""``accept --online --online-engine transformers``: transformers' own MTP decoding, with the
counts transformers reports beside the teacher-forced figure at the same positions.

The figures are transformers' (pinned to the version docs/acceptance/online.md quotes); what
is asserted is how they relate to what mtpcheck measures: transformers drafts what teacher
forcing predicts, the text it generates holds those drafts, and its count falls short by at
most one draft a sequence (the length-budget recount that page explains).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import FIXTURES

PINNED = "5.24.0"


def _workload(tmp_path: Path, fixture: str, count: int) -> Path:
    lines = (FIXTURES / fixture / "workloads" / "in_domain.jsonl").read_text().splitlines()
    path = tmp_path / "w.jsonl"
    path.write_text("\n".join(lines[:count]) + "\n")
    return path


def _online(run_cli, fixture: str, workload: Path, engine: str) -> dict:
    result = run_cli(
        "accept", FIXTURES / fixture, "--temperature", "0", "--online", "--online-engine",
        engine, "--workload", f"w={workload}", "--format", "json",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert all(line.startswith("mtpcheck: ") for line in result.stderr.splitlines())
    [online] = json.loads(result.stdout)["online_acceptance"]
    return online


@pytest.fixture(autouse=True)
def _pinned() -> None:
    import transformers

    if transformers.__version__ != PINNED:
        pytest.skip(f"transformers' MTP decoding figures pinned on {PINNED}")


def test_transformers_counts_less_than_its_output_holds(run_cli, tmp_path: Path) -> None:
    workload = _workload(tmp_path, "accept_deepseek_v3", 8)
    theirs = _online(run_cli, "accept_deepseek_v3", workload, "transformers")
    ours = _online(run_cli, "accept_deepseek_v3", workload, "mtpcheck")
    assert theirs["engine"] == "transformers" and ours["engine"] == "mtpcheck"
    drafts = theirs["drafts"]
    assert drafts == ours["drafts"] > 100  # the same drafting steps, one draft each
    # every draft transformers made is the teacher-forced draft: the output holds exactly
    # the ones teacher forcing accepts
    assert theirs["in_output"] == round(theirs["teacher_forced"] * drafts)
    assert theirs["teacher_forced"] == ours["teacher_forced"] == ours["online"]
    # transformers' count falls short by at most one draft a sequence ...
    short = theirs["in_output"] - theirs["accepted_per_position"][0]
    assert 0 < short <= theirs["sequences"]
    # ... and only there does it disagree with teacher forcing
    assert theirs["agreeing"] == drafts - short
    assert ours["agreeing"] == drafts


def test_stateful_models_are_refused_with_the_reason(run_cli, tmp_path: Path) -> None:
    workload = _workload(tmp_path, "accept_qwen3_next", 2)
    result = run_cli(
        "accept", FIXTURES / "accept_qwen3_next", "--temperature", "0", "--online",
        "--online-engine", "transformers", "--workload", f"w={workload}",
    )  # fmt: skip
    assert result.exit_code == 2
    assert (
        "transformers cannot run MTP decoding on this checkpoint: assisted generation is not "
        "supported with stateful models" in result.stderr
    )


def test_transformers_drops_step_per_layer_heads(run_cli, tmp_path: Path) -> None:
    """transformers' MtpModel ignores each Step MTP layer's own ``shared_head.head`` (its
    ``_keys_to_ignore_on_load_unexpected``) and drafts through the main ``lm_head``; on the
    trained Step-3.7 fixture, whose per-layer heads were trained apart, its drafts are almost
    never accepted, while the layers with their own heads (as vLLM serves them) draft well."""
    workload = _workload(tmp_path, "accept_step3p7", 4)
    theirs = _online(run_cli, "accept_step3p7", workload, "transformers")
    assert theirs["k"] == 3
    assert theirs["online"] < 0.05
    assert theirs["teacher_forced"] > 0.9
