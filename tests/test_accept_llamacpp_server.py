"""``accept --server`` against llama.cpp's ``llama-server`` (built from the llama-cpp-python
0.3.36 source distribution the GGUF tests use: llama.cpp 0c1e57098, ``build_server.sh``),
serving the GGUF that llama.cpp's own converter made of the Qwen3-Next fixture with MTP
speculative decoding (``--spec-type draft-mtp``, k = 3).

llama-server counts drafts per position only in ``/metrics``, and no requests: mtpcheck sends
one request at a time and tells its traffic by the generated-token counter. The test reads
``/metrics`` itself, with prometheus_client's parser, and holds mtpcheck's figures to it.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import FIXTURES
from tests.thirdparty.tools import LLAMA_SERVER, REQUIRE

pytestmark = pytest.mark.slow

QWEN = FIXTURES / "accept_qwen3_next"
GGUF = Path(__file__).resolve().parent / "data" / "llamacpp_gguf" / "accept_qwen3_next__f32__full"
#: The fixture's WordLevel tokenizer has no BPE merges; llama.cpp loads such a "gpt2" vocab
#: only as kimi-k2's (src/llama-vocab.cpp). Prompts go as token ids, so nothing is tokenised.
VOCAB = ("--override-kv", "tokenizer.ggml.pre=str:kimi-k2")


def _start(tmp_path: Path, *spec: str) -> tuple[subprocess.Popen, str, Path]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (model,) = GGUF.glob("*.gguf")
    log = tmp_path / f"llama-server-{port}.log"
    argv = [str(LLAMA_SERVER), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "--metrics", "-np", "1", "-t", "2", "-c", "128", "--seed", "0",
            *VOCAB, *spec]  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama-server exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return process, url, log
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"llama-server not ready in 120 s: {log.read_text()[-2000:]}")


@pytest.fixture
def llama_server(tmp_path: Path) -> Iterator:
    if not LLAMA_SERVER.exists():
        reason = (
            f"no llama-server at {LLAMA_SERVER}: LLAMACPP_SERVER_BUILD=.llama-server bash "
            "tests/thirdparty/llamacpp/server/build_server.sh (MTPCHECK_LLAMA_SERVER names another)"
        )
        if REQUIRE:
            pytest.fail(reason)
        pytest.skip(reason)
    started: list[subprocess.Popen] = []

    def start(*spec: str) -> str:
        process, url, _ = _start(tmp_path, *spec)
        started.append(process)
        return url

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _counters(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = sample.name + "".join(f"[{v}]" for v in sample.labels.values())
            out[key] = out.get(key, 0.0) + sample.value
    return out


def _accept(run_cli, url: str, *args: str | Path):
    return run_cli("accept", QWEN, "--server", url,
                   "--workload", f"in_domain={QWEN / 'workloads' / 'in_domain.jsonl'}",
                   "--temperature", "0", "--prompt-tokens", "9", "--new-tokens", "40",
                   "--format", "json", *args)  # fmt: skip


def test_mtp_on_llama_server(run_cli, llama_server) -> None:
    url = llama_server("--spec-type", "draft-mtp", "--spec-draft-n-max", "3")
    before = _counters(url)
    run = _accept(run_cli, url)
    after = _counters(url)
    report = json.loads(run.stdout)
    (served,) = report["server_acceptance"]
    moved = {k: after[k] - before.get(k, 0.0) for k in after}
    prefix = "llamacpp:spec_decode_num_"
    assert served["engine"] == "llama.cpp b0-0c1e57098"
    assert (served["source"], served["k"], served["requests"]) == ("counters", 3, 32)
    assert served["drafts"] == moved[prefix + "drafts_total"]
    assert served["draft_tokens"] == moved[prefix + "draft_tokens_total"]
    assert served["accepted_tokens"] == moved[prefix + "accepted_tokens_total"]
    assert served["accepted_per_position"] == [
        moved[f"{prefix}accepted_tokens_per_pos_total[{i}]"] for i in range(3)
    ]
    assert served["generated_tokens"] == moved["llamacpp:tokens_predicted_total"] == 32 * 40
    # llama.cpp's deeper drafts (its one MTP layer reused) accept less than the checkpoint's
    # drafter does offline by vLLM's draft rule on the same prompts; its first draft does not
    assert run.exit_code == 1, run
    failing = [f["details"]["position"] for c in report["checks"] for f in c["findings"]
               if f["status"] == "fail"]  # fmt: skip
    assert failing == [2, 3]
    first = served["by_position"][0]["value"]
    assert first == pytest.approx(served["expected"][0]["value"], abs=0.03)


def test_llama_server_without_speculative_decoding(run_cli, llama_server) -> None:
    url = llama_server()
    run = _accept(run_cli, url)
    assert run.exit_code == 1, run
    (check,) = json.loads(run.stdout)["checks"]
    assert [f["message"] for f in check["findings"]] == [
        "no drafter served: llama.cpp b0-0c1e57098 drafted nothing in 32 requests (speculative "
        "decoding off, or its drafter not loaded)"
    ]
