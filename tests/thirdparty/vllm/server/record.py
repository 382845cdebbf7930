"""Record what vLLM's OpenAI server really answers, for the tests that replay it
(``tests/recorded_server.py``): the failure paths no real server walks on cue.

    .venv/bin/python tests/thirdparty/vllm/server/record.py tests/data/served/vllm-0.32.0.json

Starts two servers on ``fixtures/accept_deepseek_v3`` (launch.py; the harness patches), one
with MTP speculative decoding (k = 1) and one without, and from each keeps: ``/version``,
``/v1/models``, the ``/metrics`` page before any request, after one request and after a
second one, the completion answer (the workload's first prompt, its first 9 token ids, 40
new tokens, greedy) and, from the first server, the HTTP 400 answer to a prompt holding a
token id outside the vocabulary. Server paths in the pages are replaced by ``MODEL``.
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(HERE))
import launch  # noqa: E402

FIXTURE = REPO / "fixtures" / "accept_deepseek_v3"
#: The workload's first document, tokenised by the fixture's tokenizer, first 9 ids.
PROMPT = [1, 19, 74, 29, 43, 14, 64, 63, 78]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read().decode()


def _post(url: str, body: dict) -> tuple[int, str]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def record(server: launch.Launched, model_dir: str, refused: bool) -> dict:
    base = server.url
    model = json.loads(_get(base + "/v1/models"))["data"][0]["id"]
    body = {"model": model, "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "seed": 0}
    pages = [_get(base + "/metrics")]
    status, answer = _post(base + "/v1/completions", body)
    assert status == 200, answer
    pages.append(_get(base + "/metrics"))
    _post(base + "/v1/completions", body)
    pages.append(_get(base + "/metrics"))
    out = {
        "version": json.loads(_get(base + "/version")),
        "models": json.loads(_get(base + "/v1/models")),
        "metrics": pages,
        "completion": json.loads(answer),
    }
    if refused:
        code, said = _post(base + "/v1/completions", {**body, "prompt": [1, 5000]})
        out["refused"] = {"status": code, "body": json.loads(said)}
    return json.loads(json.dumps(out).replace(model_dir, "MODEL"))


def main() -> None:
    target = Path(sys.argv[1])
    venv = REPO / ".venv-vllm"
    with tempfile.TemporaryDirectory() as work:
        servers = {
            "mtp_k1": launch.start(venv, FIXTURE, 1, Path(work, "k1")),
            "no_spec": launch.start(venv, FIXTURE, 0, Path(work, "k0")),
        }
        try:
            recorded = {}
            for name, server in servers.items():
                launch.ready(server)
                model_dir = str(Path(work, "k1" if name == "mtp_k1" else "k0", FIXTURE.name))
                recorded[name] = record(server, model_dir, refused=name == "mtp_k1")
        finally:
            for server in servers.values():
                launch.stop(server)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(recorded, indent=1) + "\n")
    print(f"{target}: {target.stat().st_size} bytes")


if __name__ == "__main__":
    main()
