"""``accept --server`` on what real servers answered, replayed on loopback
(``tests/recorded_server.py``): the ways a server goes wrong, each one line and its exit code,
and the engines that do not run here (SGLang, TensorRT-LLM), read by the names their sources
give. The figures on live vLLM servers: ``tests/test_accept_server.py``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tests.conftest import FIXTURES
from tests.recorded_server import Script, replaying

SERVED = Path(__file__).resolve().parent / "data" / "served"
VLLM = json.loads((SERVED / "vllm-0.32.0.json").read_text())
DEEPSEEK = FIXTURES / "accept_deepseek_v3"
#: What vLLM's recorded completion says about its one request (metrics.speculative_decoding)
SPEC = VLLM["mtp_k1"]["completion"]["metrics"]["speculative_decoding"]


@pytest.fixture
def one_prompt(tmp_path: Path) -> Path:
    """The workload of the recorded request: the fixture's first document (cut to its first
    9 token ids, as recorded)."""
    first = (DEEPSEEK / "workloads" / "in_domain.jsonl").read_text().splitlines()[0]
    path = tmp_path / "one.jsonl"
    path.write_text(first + "\n")
    return path


def _vllm_script(kind: str = "mtp_k1", pages: tuple[int, ...] = (0, 1)) -> Script:
    recorded = VLLM[kind]
    return Script(
        metrics=[recorded["metrics"][i] for i in pages],
        completions=[recorded["completion"]],
        pages={"/version": recorded["version"], "/v1/models": recorded["models"]},
    )


def _accept(run_cli, url: str, workload: Path, *args: str | Path):
    return run_cli("accept", "--server", url, "--workload", f"one={workload}",
                   "--tokenizer", DEEPSEEK, "--temperature", "0", "--new-tokens", "40",
                   *args)  # fmt: skip


def _error(run) -> str:
    assert run.stdout == "", run
    lines = run.stderr.strip().splitlines()
    return lines[-1]


# --- what vLLM 0.32 answered ------------------------------------------------------------------


def test_per_request_figures_add_up_to_the_counters(run_cli, one_prompt: Path) -> None:
    script = _vllm_script()
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt, "--format", "json")
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    from tests.test_readme import _report_example, _shape

    example, real = _shape(_report_example()), _shape(report)
    for place in ("", "server_acceptance[]"):
        assert real[place] == example[place], place  # docs/report.md names every field
    (served,) = report["server_acceptance"]
    histogram = SPEC["acceptance_histogram"]
    assert served["engine"] == "vLLM 0.32.0"
    assert served["source"] == "per-request"
    assert (served["drafts"], served["draft_tokens"], served["accepted_tokens"]) == (
        SPEC["num_spec_steps"], SPEC["num_draft_tokens"], SPEC["num_accepted_draft_tokens"],
    )  # fmt: skip
    assert served["accepted_per_position"] == [sum(histogram[1:])]
    assert served["prompt_tokens"] == 9 and served["k"] == 1
    # the counters moved by exactly this request: cross-checked, no note
    (check,) = report["checks"]
    assert [f["status"] for f in check["findings"]] == ["pass"]
    # token ids went out, with the seed and the settings asked
    (body,) = script.bodies
    assert body["prompt"] == [1, 19, 74, 29, 43, 14, 64, 63, 78]  # as record.py sent it
    assert (body["max_tokens"], body["temperature"], body["seed"]) == (40, 0.0, 0)


def test_a_server_without_speculative_decoding_is_a_finding(run_cli, one_prompt: Path) -> None:
    with replaying(_vllm_script("no_spec")) as url:
        run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 1, run
    assert (
        "no drafter served: vLLM 0.32.0 drafted nothing in 1 requests (speculative decoding "
        "off, or its drafter not loaded)"
    ) in " ".join(run.stdout.split())


def test_counters_that_go_down_mean_a_restart(run_cli, one_prompt: Path) -> None:
    with replaying(_vllm_script(pages=(1, 0))) as url:
        run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 2, run
    assert _error(run) == (
        f"mtpcheck: error: {url}/metrics: vllm:request_success_total went down from 1 to 0 "
        "during the run: the server restarted (its counters reset); run again"
    )


def test_counters_moved_by_others_are_refused(run_cli, one_prompt: Path) -> None:
    # vLLM started without --per-request-spec-decode-metrics: only its counters count, and
    # between the two scrapes two requests finished for the one mtpcheck sent
    script = _vllm_script(pages=(0, 2))
    script.completions = [{**VLLM["mtp_k1"]["completion"], "metrics": None}]
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt, "--concurrency", "1")
    assert run.exit_code == 2, run
    assert _error(run) == (
        f"mtpcheck: error: {url}/metrics: vllm:request_success_total moved by 2 where "
        "mtpcheck's requests account for 1: another client's requests are in the counters; "
        "measure on a server (or replica) no one else uses now"
    )


def test_counters_alone_give_the_figures(run_cli, one_prompt: Path) -> None:
    script = _vllm_script()
    script.completions = [{**VLLM["mtp_k1"]["completion"], "metrics": None}]
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt, "--concurrency", "1", "--format", "json")
    assert run.exit_code == 0, run
    (served,) = json.loads(run.stdout)["server_acceptance"]
    assert served["source"] == "counters"
    assert (served["drafts"], served["accepted_tokens"], served["accepted_per_position"]) == (
        SPEC["num_spec_steps"], SPEC["num_accepted_draft_tokens"],
        [SPEC["num_accepted_draft_tokens"]],
    )  # fmt: skip


def test_per_request_figures_stand_beside_others_traffic(run_cli, one_prompt: Path) -> None:
    with replaying(_vllm_script(pages=(0, 2))) as url:
        run = _accept(run_cli, url, one_prompt, "--format", "json")
    assert run.exit_code == 0, run
    info = json.loads(run.stdout)["checks"][0]["findings"][1]
    assert info["status"] == "info"
    assert info["message"] == (
        "vllm:request_success_total moved by 2 where mtpcheck's requests account for 1 (others' "
        "traffic, or counters that lag): the per-request figures stand, not cross-checked with "
        "the counters"
    )


def test_a_refused_prompt_is_one_line(run_cli, one_prompt: Path) -> None:
    script = _vllm_script()
    script.refuse_token_ids = VLLM["mtp_k1"]["refused"]["body"]
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 2, run
    assert _error(run) == (
        f"mtpcheck: error: {url}/v1/completions: HTTP 400 Bad Request: Token id 5000 is out of "
        "vocabulary"
    )


def test_a_server_that_does_not_answer(run_cli, one_prompt: Path) -> None:
    with replaying(_vllm_script()) as url:
        pass  # stopped: nothing listens there now
    run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 2, run
    assert re.fullmatch(
        rf"mtpcheck: error: {url}/metrics: no answer \(.*[Cc]onnection refused.*\); mtpcheck "
        r"reads the engine's counters there \(llama-server needs --metrics, SGLang "
        r"--enable-metrics\)",
        _error(run),
    ), run.stderr


def _page(*metrics: tuple[type, str, dict[str, str], float]) -> str:
    """Exposition text written by prometheus_client itself."""
    registry = CollectorRegistry()
    made: dict[str, Counter | Gauge] = {}
    for kind, name, labels, value in metrics:
        if name not in made:
            made[name] = kind(name, name, list(labels), registry=registry)
        metric = made[name]
        child = metric.labels(**labels) if labels else metric
        child.inc(value) if kind is Counter else child.set(value)
    return generate_latest(registry).decode()


def test_an_engine_mtpcheck_does_not_know(run_cli, one_prompt: Path) -> None:
    page = _page((Counter, "myengine_requests", {}, 3))
    with replaying(Script(metrics=[page])) as url:
        run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 2, run
    assert _error(run) == (
        f"mtpcheck: error: {url}/metrics: no serving engine mtpcheck knows exports these metrics "
        "(myengine_requests_created, myengine_requests_total); it reads vllm:* (vllm), "
        "sglang:* (sglang), llamacpp:* (llamacpp), trtllm_* (trtllm); name one with "
        "--server-engine if a proxy renames them"
    )


def test_renamed_speculative_metrics_are_refused(run_cli, one_prompt: Path) -> None:
    renamed = [p.replace("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_verify_steps")
               for p in VLLM["mtp_k1"]["metrics"]]  # fmt: skip
    script = _vllm_script()
    script.metrics = renamed
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 2, run
    assert _error(run).startswith(
        f"mtpcheck: error: {url}/metrics: vLLM 0.32.0 exports speculative-decoding metrics "
        "mtpcheck does not know (vllm:spec_decode_num_verify_steps_created, "
        "vllm:spec_decode_num_verify_steps_total); it reads the names of vllm/v1/spec_decode/"
    )
    assert script.posts == 0  # refused before a request was sent


# --- profiles ---------------------------------------------------------------------------------


def test_profile_round_trip_and_its_refusals(run_cli, one_prompt: Path, tmp_path: Path) -> None:
    saved = tmp_path / "profile.json"
    with replaying(_vllm_script()) as url:
        first = _accept(run_cli, url, one_prompt, "--save-profile", saved)
    assert first.exit_code == 0, first
    profile = json.loads(saved.read_text())
    assert profile["settings"] == {"temperature": 0.0, "prompt_tokens": 9, "new_tokens": 40,
                                   "k": 1}  # fmt: skip
    assert profile["workloads"]["one"]["accepted_per_position"] == [
        SPEC["num_accepted_draft_tokens"]
    ]
    with replaying(_vllm_script()) as url:
        again = _accept(run_cli, url, one_prompt, "--profile", saved)
    assert again.exit_code == 0, again
    assert f"holds to profile {saved} (" in " ".join(again.stdout.split())
    # other settings do not compare
    with replaying(_vllm_script()) as url:
        other = _accept(run_cli, url, one_prompt, "--profile", saved, "--prompt-tokens", "5")
    assert other.exit_code == 2, other
    assert _error(other) == (
        f"mtpcheck: error: {saved}: the profile was measured with other settings, so its figures "
        "do not compare: prompt_tokens 9 here 5"
    )
    # a profile that is not one
    saved.write_text("[1, 2]")
    with replaying(_vllm_script()) as url:
        broken = _accept(run_cli, url, one_prompt, "--profile", saved)
    assert broken.exit_code == 2, broken
    assert _error(broken) == (
        f"mtpcheck: error: {saved}: not an mtpcheck acceptance profile (--save-profile writes one)"
    )


def test_a_lower_figure_fails_the_profile_naming_workload_and_position(
    run_cli, one_prompt: Path, tmp_path: Path
) -> None:
    saved = tmp_path / "profile.json"
    with replaying(_vllm_script()) as url:
        assert _accept(run_cli, url, one_prompt, "--save-profile", saved).exit_code == 0
    # the recorded request accepted every draft; the same request on a worse day: 3 of its 20
    # steps rejected (the counters, moved by another request too, cannot cross-check it)
    worse = json.loads(json.dumps(VLLM["mtp_k1"]["completion"]))
    spec = worse["metrics"]["speculative_decoding"]
    spec["acceptance_histogram"], spec["num_accepted_draft_tokens"] = [3, 17], 17
    script = _vllm_script(pages=(0, 2))
    script.completions = [worse]
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt, "--profile", saved, "--format", "json")
    assert run.exit_code == 1, run
    failing = [f for c in json.loads(run.stdout)["checks"] for f in c["findings"]
               if f["status"] == "fail"]  # fmt: skip
    assert [f["message"] for f in failing] == [
        f"position 1: 0.850 below profile {saved}'s 1.000 (no spread known on either side: any "
        "drop fails); give CKPT to tell the checkpoint's drafter from the engine serving it"
    ]


# --- engines that do not run here: their sources' names ---------------------------------------


def _completion(extra: dict) -> dict:
    return {"id": "x", "object": "text_completion", "model": "m", "choices": [{"index": 0,
            "text": "t", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 40, "total_tokens": 49},
            **extra}  # fmt: skip


def test_sglang_per_request_details(run_cli, one_prompt: Path) -> None:
    # SGLang 0.5.23: /v1/completions with return_spec_tokens_details answers sglext
    # .spec_tokens_details (SpecTokensDetails, entrypoints/openai/protocol.py); its /metrics
    # holds gauges and a verify-call counter (observability/metrics_collector.py)
    details = {"spec_verify_ct": 16, "spec_num_correct_drafts": 30, "spec_num_proposed_drafts":
               48, "spec_accept_rate": 0.625, "spec_accept_length": 2.5,
               "spec_correct_drafts_histogram": [2, 4, 6, 4]}  # fmt: skip
    labels = {"engine_type": "unified", "model_name": "m", "moe_ep_rank": "0", "pp_rank": "0",
              "tp_rank": "0"}  # fmt: skip
    page = _page(
        (Gauge, "sglang:spec_accept_length", labels, 2.5),
        (Gauge, "sglang:spec_accept_rate", labels, 0.625),
        (Counter, "sglang:spec_verify_calls", {"engine_type": "unified", "model_name": "m"}, 16),
    )
    script = Script(
        metrics=[page],
        completions=[_completion({"sglext": {"spec_tokens_details": details}})],
        pages={"/server_info": {"version": "0.5.23", "frontend": "python"},
               "/v1/models": {"data": [{"id": "m"}]}},
    )  # fmt: skip
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt, "--format", "json")
    assert run.exit_code == 0, run
    (served,) = json.loads(run.stdout)["server_acceptance"]
    assert served["engine"] == "SGLang 0.5.23"
    assert served["k"] == 3
    assert (served["drafts"], served["draft_tokens"], served["accepted_tokens"]) == (16, 48, 30)
    assert served["accepted_per_position"] == [14, 10, 4]
    assert script.bodies[0]["return_spec_tokens_details"] is True


def test_sglang_without_speculative_decoding(run_cli, one_prompt: Path) -> None:
    # asked for its spec_tokens_details, SGLang adds them only with a speculative algorithm
    # set (managers/tokenizer_manager.py): a response without them is a server that drafts
    # nothing
    script = Script(
        metrics=[_page((Counter, "sglang:num_requests", {"model_name": "m"}, 3))],
        completions=[_completion({})],
        pages={"/server_info": {"version": "0.5.23"}, "/v1/models": {"data": [{"id": "m"}]}},
    )
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt)
    assert run.exit_code == 1, run
    assert "no drafter served: SGLang 0.5.23 drafted nothing in 1 requests" in " ".join(
        run.stdout.split()
    )


def test_tensorrt_llm_counters_per_position(run_cli, one_prompt: Path) -> None:
    # TensorRT-LLM main (1.3.0rc): Prometheus on /prometheus/metrics, prefix trtllm_,
    # per-position counters labelled token_position (tensorrt_llm/metrics/collector.py);
    # /metrics answers JSON iteration stats
    base = {"engine_type": "undefined", "model_name": "m"}

    def page(requests: int, steps: int, at: tuple[int, int]) -> str:
        return _page(
            (Counter, "trtllm_request_success", {**base, "finished_reason": "length"}, requests),
            (Counter, "trtllm_spec_decode_num_draft_tokens", base, 2 * steps),
            (Counter, "trtllm_spec_decode_num_accepted_tokens", base, sum(at)),
            (Counter, "trtllm_spec_decode_drafted_tokens", {**base, "token_position": "0"}, steps),
            (Counter, "trtllm_spec_decode_drafted_tokens", {**base, "token_position": "1"}, steps),
            (Counter, "trtllm_spec_decode_accepted_tokens", {**base, "token_position": "0"}, at[0]),
            (Counter, "trtllm_spec_decode_accepted_tokens", {**base, "token_position": "1"}, at[1]),
            (Counter, "trtllm_generation_tokens", base, 40 * requests),
        )

    script = Script(
        metrics=[page(5, 100, (80, 50)), page(6, 120, (96, 61))],
        metrics_path="/prometheus/metrics",
        completions=[_completion({})],
        pages={"/metrics": [{"iterLatencyMS": 1.0}], "/version": {"version": "1.3.0rc9"},
               "/v1/models": {"data": [{"id": "m"}]}},
    )  # fmt: skip
    with replaying(script) as url:
        run = _accept(run_cli, url, one_prompt, "--format", "json", "--concurrency", "1")
    assert run.exit_code == 0, run
    (served,) = json.loads(run.stdout)["server_acceptance"]
    assert served["engine"] == "TensorRT-LLM 1.3.0rc9"
    assert (served["source"], served["k"], served["drafts"]) == ("counters", 2, 20)
    assert served["accepted_per_position"] == [16, 11]
    assert [p["value"] for p in served["by_position"]] == [16 / 20, 11 / 20]


# --- usage ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--save-profile", "p.json"), "--save-profile needs --server"),
        (("--server", "http://127.0.0.1:9", "--compare", DEEPSEEK),
         "--compare does not apply to --server"),
        (("--server", "http://127.0.0.1:9", "--engine", "vllm"),
         "--engine does not apply to --server"),
    ],
)  # fmt: skip
def test_usage(run_cli, one_prompt: Path, args: tuple, message: str) -> None:
    run = run_cli("accept", DEEPSEEK, "--workload", f"one={one_prompt}", *args)
    assert run.exit_code == 2, run
    assert message in run.stderr


def test_without_ckpt_outside_server(run_cli, one_prompt: Path) -> None:
    run = run_cli("accept", "--workload", f"one={one_prompt}")
    assert run.exit_code == 2, run
    assert "Missing argument 'CKPT' (only --server runs without one)." in run.stderr


def test_markdown_summary_and_no_torch(tmp_path: Path, one_prompt: Path) -> None:
    # a run on a server with text prompts loads no model: torch is never imported, and the
    # Markdown summary (e.g. $GITHUB_STEP_SUMMARY) carries the served figures
    import subprocess
    import sys

    summary = tmp_path / "summary.md"
    probe = (
        "import sys\nfrom mtpcheck.cli import main\ncode = 0\ntry:\n    code = main()\n"
        "except SystemExit as e:\n    code = e.code\n"
        "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\nsys.exit(code)\n"
    )
    with replaying(_vllm_script()) as url:
        done = subprocess.run(
            [sys.executable, "-c", probe, "accept", "--server", url, "--workload",
             f"one={one_prompt}", "--temperature", "0", "--markdown", str(summary)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "torch imported: False"
    text = summary.read_text()
    assert "**MTP acceptance served by vLLM 0.32.0**" in text
    assert f"| one | {SPEC['num_spec_steps']} | 1.000 | — | 2.00 |" in text
