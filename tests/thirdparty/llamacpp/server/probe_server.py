"""Start llama-server on one GGUF, send a few greedy completions, read its metrics, stop it.

    python3 tests/thirdparty/llamacpp/server/probe_server.py \
        --server .llama-server/build/bin/llama-server \
        --model tests/data/llamacpp_gguf/accept_deepseek_v3__f32__full/*.gguf \
        --fixture fixtures/accept_deepseek_v3 --out /tmp/probe.json \
        [--port 18181] [--n-prompts 4] [--n-predict 40] -- [extra llama-server args...]

Extra args after `--` go to llama-server unchanged (e.g. `--spec-type draft-mtp`,
`-md DRAFT.gguf --spec-draft-n-max 3`).  Always added: `--host 127.0.0.1 --port P --metrics
--slots -c 256 -np 1 -t 2 --seed 0 --no-warmup`.

Prompts: the first `--n-prompts` documents of the fixture's workloads/in_domain.jsonl, as
mtpcheck's workloads.tokenise does for these WordLevel fixtures: <bos> (id 1) + the word ids,
cut to `--prompt-tokens` (9).  Each prompt goes once to POST /completion (n_predict) and once
to POST /v1/completions (max_tokens), temperature 0, as a list of token ids.

Writes one JSON: argv, the server's exit status / log tail if it failed to start, GET /props
(chat_template cut), GET /version status, GET /v1/models, /metrics text before and after, the
parsed `llamacpp:*` samples and their difference, every response, GET /slots.  The server is
killed in all cases (SIGTERM, then SIGKILL after 10 s).  Standard library only.
"""

import argparse
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def http(base: str, path: str, body=None, timeout: float = 120.0):
    """(status, parsed JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base + path, data=data, headers={"Content-Type": "application/json"} if data else {}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read().decode(errors="replace")
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def parse_metrics(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        m = SAMPLE.match(line.strip())
        if m and not line.startswith("#"):
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def metric_types(text: str) -> dict:
    return {ln.split()[2]: ln.split()[3] for ln in text.splitlines() if ln.startswith("# TYPE ")}


def prompts(fixture: Path, n: int, n_tokens: int) -> list:
    vocab = json.loads((fixture / "tokenizer.json").read_text())["model"]["vocab"]
    out = []
    for line in (fixture / "workloads" / "in_domain.jsonl").read_text().splitlines()[:n]:
        words = json.loads(line)["text"].split()
        out.append(([vocab["<bos>"]] + [vocab[w] for w in words])[:n_tokens])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--fixture", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--port", type=int, default=18181)
    ap.add_argument("--n-prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=9)
    ap.add_argument("--n-predict", type=int, default=40)
    ap.add_argument("--start-timeout", type=float, default=180.0)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    # `timeout` sends SIGTERM: turn it into SystemExit so that `finally` kills the server
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    base = f"http://127.0.0.1:{a.port}"
    log = a.out.with_suffix(".server.log")
    argv = [
        a.server,
        "-m",
        a.model,
        "--host",
        "127.0.0.1",
        "--port",
        str(a.port),
        "--metrics",
        "--slots",
        "-c",
        "256",
        "-np",
        "1",
        "-t",
        "2",
        "--seed",
        "0",
        "--no-warmup",
        *a.extra,
    ]
    res: dict = {"argv": argv, "server_log": str(log)}
    t0 = time.time()
    with open(log, "w") as lf:
        proc = subprocess.Popen(argv, stdout=lf, stderr=subprocess.STDOUT)
    try:
        ready = False
        while time.time() - t0 < a.start_timeout:
            if proc.poll() is not None:
                break
            try:
                st, _ = http(base, "/health", timeout=5)
                if st == 200:
                    ready = True
                    break
            except OSError:
                pass
            time.sleep(0.5)
        res["start_seconds"] = round(time.time() - t0, 2)
        if not ready:
            res["started"] = False
            res["exit_code"] = proc.poll()
            res["log_tail"] = log.read_text(errors="replace").splitlines()[-40:]
            return finish(a.out, res, proc, 1)
        res["started"] = True
        st, props = http(base, "/props")
        if isinstance(props, dict):
            props["chat_template"] = str(props.get("chat_template", ""))[:80] + "..."
        res["props"] = {"status": st, "body": props}
        st, ver = http(base, "/version")
        res["version_endpoint"] = {"status": st, "body": ver}
        res["v1_models"] = http(base, "/v1/models")[1]
        _, m0 = http(base, "/metrics")
        res["metrics_before"] = m0
        res["responses"] = []
        for ids in prompts(a.fixture, a.n_prompts, a.prompt_tokens):
            for path, body in (
                (
                    "/completion",
                    {
                        "prompt": ids,
                        "n_predict": a.n_predict,
                        "temperature": 0,
                        "seed": 0,
                        "cache_prompt": False,
                        "return_tokens": True,
                    },
                ),
                (
                    "/v1/completions",
                    {
                        "prompt": ids,
                        "max_tokens": a.n_predict,
                        "temperature": 0,
                        "seed": 0,
                        "cache_prompt": False,
                    },
                ),
            ):
                t = time.time()
                st, r = http(base, path, body, timeout=300)
                res["responses"].append(
                    {
                        "path": path,
                        "prompt": ids,
                        "status": st,
                        "seconds": round(time.time() - t, 3),
                        "body": r,
                    }
                )
        _, m1 = http(base, "/metrics")
        res["metrics_after"] = m1
        res["metric_types"] = metric_types(m1)
        p0, p1 = parse_metrics(m0), parse_metrics(m1)
        res["metrics_diff"] = {k: p1[k] - p0.get(k, 0.0) for k in p1}
        res["slots"] = http(base, "/slots")[1]
        return finish(a.out, res, proc, 0)
    finally:
        if proc.poll() is None:
            proc.kill()


def finish(out: Path, res: dict, proc: subprocess.Popen, rc: int) -> int:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    res["server_returncode"] = proc.returncode
    out.write_text(json.dumps(res, indent=1))
    print(
        json.dumps(
            {
                "out": str(out),
                "started": res.get("started"),
                "n_responses": len(res.get("responses", [])),
            }
        )
    )
    return rc


if __name__ == "__main__":
    sys.exit(main())
