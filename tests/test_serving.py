"""``serving``: what a serving engine builds from the config, where it is not what was trained.

The DeepSeek-V3 router case is confirmed end to end with vLLM 0.32 itself (CPU build, its
offline engine in ``tests/thirdparty/vllm/probe_router.py``): the trained fixture's config
without ``topk_method`` is refused on load; with ``topk_method`` alone vLLM routes with
softmax; with both keys, as the fixture ships, it builds transformers' sigmoid router with the
correction bias.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.conftest import FIXTURES
from tests.thirdparty.tools import REQUIRE, VLLM_VENV

VLLM_DIR = Path(__file__).resolve().parent / "thirdparty" / "vllm"
VENV = VLLM_VENV
ROUTER_KEYS = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}


def _with_config(src: Path, dst: Path, **changes: Any) -> Path:
    """A copy of ``src`` whose config has ``changes`` (a None value removes the key)."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def _serving(run_cli, ckpt: Path, code: int) -> list[tuple[str, str, str]]:
    run = run_cli("inspect", ckpt, "--format", "json")
    assert run.exit_code == code, run
    (check,) = [c for c in json.loads(run.stdout)["checks"] if c["name"] == CheckName.SERVING]
    return [(f["status"], f["subject"], f["message"]) for f in check["findings"]]


def test_deepseek_v3_without_router_keys_warns_naming_the_engine(run_cli) -> None:
    findings = _serving(run_cli, FIXTURES / "deepseek_v3", 0)
    assert findings == [
        (
            "warn",
            "scoring_func",
            "absent: vLLM 0.32.0 reads it as 'softmax' (vllm/model_executor/models/"
            "deepseek_v2.py) and routes every MoE layer, the MTP layer's included, with "
            "softmax scores instead of sigmoid; transformers builds 'sigmoid' (add "
            '"scoring_func": "sigmoid")',
        ),
        (
            "warn",
            "topk_method",
            "absent: vLLM 0.32.0 reads it as None (vllm/model_executor/models/deepseek_v2.py) "
            "and refuses to load the checkpoint, which stores mlp.gate.e_score_correction_bias "
            "(KeyError: 'layers.1.mlp.gate.e_score_correction_bias' in load_weights); "
            'transformers builds \'noaux_tc\' (add "topk_method": "noaux_tc")',
        ),
        (
            "info",
            "mtp copies",
            "vLLM 0.32.0 drafts through the main embedding and head, not the MTP layer's stored "
            "copies (vllm/v1/spec_decode/llm_base_proposer.py)",
        ),
    ]


def test_the_release_keys_pass(run_cli, tmp_path: Path) -> None:
    ckpt = _with_config(FIXTURES / "deepseek_v3", tmp_path / "ds", **ROUTER_KEYS)
    findings = _serving(run_cli, ckpt, 0)
    assert findings[0] == (
        "pass",
        "serving",
        "vLLM 0.32.0 builds what transformers builds from this config",
    )


def test_a_stated_softmax_router_fails(run_cli, tmp_path: Path) -> None:
    """transformers ignores ``scoring_func`` and routes DeepSeek-V3 with sigmoid; vLLM obeys
    it: the served model is not the trained one."""
    ckpt = _with_config(
        FIXTURES / "glm_moe_dsa", tmp_path / "glm5", scoring_func="softmax", topk_method="noaux_tc"
    )
    (finding,) = [f for f in _serving(run_cli, ckpt, 1) if f[0] != "info"]
    assert finding == (
        "fail",
        "scoring_func",
        "'softmax': vLLM 0.32.0 builds with it (vllm/model_executor/models/deepseek_v2.py), "
        "transformers ignores the key and builds 'sigmoid': served and trained models differ",
    )


def test_nemotron_h_repeated_mtp_count_is_refused_by_vllm(run_cli, tmp_path: Path) -> None:
    """Megatron-Bridge 5946: Nemotron-H's repeated MTP layer exported as
    ``num_nextn_predict_layers: 2`` where the release says 1; vLLM refuses it, and roundtrip
    says so before converting anything."""
    ckpt = _with_config(FIXTURES / "nemotron_h", tmp_path / "nh", num_nextn_predict_layers=2)
    findings = _serving(run_cli, ckpt, 1)
    assert findings == [
        (
            "fail",
            "num_nextn_predict_layers",
            "2: vLLM 0.32.0 refuses to build the drafter (vllm/model_executor/models/"
            'nemotron_h_mtp.py: "Only one MTP layer is supported for NemotronH-MTP"); it '
            "accepts 1",
        )
    ]
    work = tmp_path / "work"
    run = run_cli("roundtrip", ckpt, "--workdir", work, "--format", "json")
    assert run.exit_code == 1, run
    statuses = {c["name"]: c["status"] for c in json.loads(run.stdout)["checks"]}
    assert statuses[CheckName.SOURCE_SERVING] == "fail"
    assert statuses[CheckName.STAGE1_CONVERT] == "skip"


def test_families_without_engine_facts_are_skipped(run_cli) -> None:
    assert _serving(run_cli, FIXTURES / "qwen3_next", 0) == [
        ("skip", "serving", "no engine reading known to differ from transformers for this family")
    ]


# --- confirmed with vLLM 0.32 itself -----------------------------------------------------------


@pytest.fixture(scope="module")
def shimmed_python() -> Path:
    if not (VENV / "bin" / "python").exists():
        reason = f"no vLLM venv at {VENV}: bash tests/thirdparty/vllm/install_venv.sh {VENV}"
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)
    return VLLM_DIR / "shimmed_python"


def _probe(shimmed_python: Path, *ckpts: Path) -> list[str]:
    run = subprocess.run(
        [str(shimmed_python), str(VLLM_DIR / "probe_router.py"), *map(str, ckpts)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith(("ROUTER ", "REFUSED "))]
    assert len(lines) == len(ckpts), run.stdout[-2000:] + run.stderr[-4000:]
    return lines


@pytest.mark.slow
def test_vllm_builds_what_the_check_says(shimmed_python: Path, tmp_path: Path) -> None:
    fixture = FIXTURES / "accept_deepseek_v3"  # has a tokenizer and the release's two keys
    neither = _with_config(fixture, tmp_path / "neither", topk_method=None, scoring_func=None)
    alone = _with_config(fixture, tmp_path / "topk", topk_method="noaux_tc", scoring_func=None)
    assert _probe(shimmed_python, neither, alone, fixture) == [
        "REFUSED KeyError: 'layers.1.mlp.gate.e_score_correction_bias'",
        'ROUTER {"model.layers.1.mlp.experts.routed_experts": ["softmax", true]}',
        'ROUTER {"model.layers.1.mlp.experts.routed_experts": ["sigmoid", true]}',
    ]
