"""Send the workload's prompts to a running vLLM server (serve.py); diff its /metrics.

    .venv-vllm/bin/python tests/thirdparty/vllm/server/probe.py MODEL_COPY \
        --workload fixtures/accept_deepseek_v3/workloads/in_domain.jsonl \
        [--mode sequential|concurrent|batched] [--port 8765] [--out result.json]

Prompts: the first 9 token ids of each document, tokenised exactly as run_vllm.py does
(its load_prompts: mtpcheck.accept.workloads from this checkout's src, with the copy's
tokenizer). Each is sent to POST /v1/completions as a list of token ids, max_tokens 40,
temperature 0, seed 0, return_token_ids true:
  sequential  one request at a time;
  concurrent  one request per prompt, all in flight together (32 threads);
  batched     one request whose prompt is the list of all 32 token-id lists.
Prints one JSON object: the difference of vLLM's Prometheus counters after - before, the
sum of the per-request `metrics.speculative_decoding` of the responses, /version, /v1/models.
HTTP is standard library (urllib); only the prompt tokenisation needs the vLLM venv.
"""

import argparse
import json
import re
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# Prometheus families read here (all counters; samples end in _total)
SPEC = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
OTHER = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")


def http(base: str, path: str, body=None, timeout=300):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        base + path, data=data, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        text = r.read().decode()
    return text if path == "/metrics" else json.loads(text)


def counters(metrics_text: str) -> dict:
    """{(name, labels-without-engine/model_name): value} for the families above."""
    out = {}
    for line in metrics_text.splitlines():
        m = SAMPLE.match(line)
        if not m or m.group(1) not in SPEC + OTHER + (PER_POS,):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        key = (
            m.group(1),
            tuple(sorted((k, v) for k, v in labels.items() if k not in ("engine", "model_name"))),
        )
        out[key] = out.get(key, 0) + float(m.group(3))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path, help="the fixture copy the server serves")
    p.add_argument("--workload", type=Path, required=True)
    p.add_argument("--mode", choices=["sequential", "concurrent", "batched"], default="sequential")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--prompt-tokens", type=int, default=9)
    p.add_argument("--new-tokens", type=int, default=40)
    p.add_argument("--out", type=Path, default=None, help="also write the JSON (+ responses)")
    args = p.parse_args()
    base = f"http://127.0.0.1:{args.port}"

    from run_vllm import load_prompts  # the offline run's own tokenisation

    prompts, _ = load_prompts(args.model, args.workload, args.prompt_tokens)
    model = http(base, "/v1/models")["data"][0]["id"]

    def complete(prompt):
        return http(
            base,
            "/v1/completions",
            {
                "model": model,
                "prompt": prompt,
                "max_tokens": args.new_tokens,
                "temperature": 0,
                "seed": 0,
                "return_token_ids": True,
            },
        )

    before = counters(http(base, "/metrics"))
    t0 = time.monotonic()
    if args.mode == "sequential":
        responses = [complete(q) for q in prompts]
    elif args.mode == "concurrent":
        with ThreadPoolExecutor(len(prompts)) as pool:
            responses = list(pool.map(complete, prompts))
    else:
        responses = [complete(prompts)]
    seconds = time.monotonic() - t0
    time.sleep(1.0)  # the API process records engine stats asynchronously
    after = counters(http(base, "/metrics"))

    diff = {}
    for key in sorted(set(before) | set(after)):
        d = after.get(key, 0) - before.get(key, 0)
        if d:
            diff[
                key[0] + ("{" + ",".join(f'{k}="{v}"' for k, v in key[1]) + "}" if key[1] else "")
            ] = d
    per_request = {
        "n": 0,
        "num_spec_steps": 0,
        "num_draft_tokens": 0,
        "num_accepted_draft_tokens": 0,
    }
    for r in responses:
        sd = (r.get("metrics") or {}).get("speculative_decoding")
        if sd:
            per_request["n"] += 1
            for k in ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens"):
                per_request[k] += sd[k]
    choices = [c for r in responses for c in r["choices"]]
    result = {
        "mode": args.mode,
        "num_prompts": len(prompts),
        "seconds": round(seconds, 2),
        "version": http(base, "/version"),
        "finish_reasons": sorted({c["finish_reason"] for c in choices}),
        "generated_tokens": sum(len(c.get("token_ids") or []) for c in choices),
        "metrics_diff": diff,
        "per_request_sum": per_request,
        "first_response": responses[0],
    }
    print(json.dumps(result, indent=1))
    if args.out:
        ordered = sorted(choices, key=lambda c: c["index"])
        result["generated"] = [c.get("token_ids") for c in ordered]
        result["prompts"] = prompts
        result["spec_decode"] = [
            (r.get("metrics") or {}).get("speculative_decoding") for r in responses
        ]
        args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
