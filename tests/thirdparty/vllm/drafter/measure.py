"""One vLLM server with the EAGLE-3 drafter; ``mtpcheck accept --server`` on it at each
temperature, beside the difference of vLLM's own /metrics counters over that run.

    .venv/bin/python tests/thirdparty/vllm/drafter/measure.py [--temperature 0 --temperature 1]
        [--target DIR] [--drafter DIR] [--draft-tokens 3] [--out result.json]

Prints one JSON object per temperature: the exact ``mtpcheck accept`` command, its per-position
counts and vLLM's, the seconds each step took. The server is always stopped.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
sys.path.insert(0, str(HERE))
import drafter_launch as launch  # noqa: E402

MTPCHECK = REPO / ".venv" / "bin" / "mtpcheck"
VENV = REPO / ".venv-vllm"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", type=Path, default=REPO / "tests/data/speculators/llama-target")
    p.add_argument("--drafter", type=Path, default=REPO / "tests/data/speculators/eagle3")
    p.add_argument("--draft-tokens", type=int, default=3)
    p.add_argument("--temperature", action="append", default=None)
    p.add_argument("--workload", type=Path, default=HERE / "workload.jsonl")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as work:
        t0 = time.monotonic()
        server = launch.start(VENV, args.target, args.drafter, args.draft_tokens, Path(work))
        try:
            launch.ready(server, timeout=300)
            up = time.monotonic() - t0
            for temperature in args.temperature or ["0", "1"]:
                command = [
                    str(MTPCHECK),
                    "accept",
                    "--server",
                    server.url,
                    "--drafter",
                    str(args.drafter),
                    "--tokenizer",
                    str(args.target),
                    "--workload",
                    f"small={args.workload}",
                    "--temperature",
                    temperature,
                    "--prompt-tokens",
                    "9",
                    "--new-tokens",
                    "40",
                    "--format",
                    "json",
                ]
                before = launch.spec_counters(server.url)
                t1 = time.monotonic()
                run = subprocess.run(command, capture_output=True, text=True, timeout=600)
                seconds = time.monotonic() - t1
                after = launch.spec_counters(server.url)
                if run.returncode not in (0, 1):
                    raise SystemExit(run.stderr)
                (served,) = json.loads(run.stdout)["server_acceptance"]
                moved = launch.difference(after, before)
                mine = {k: served[k] for k in ("drafts", "draft_tokens", "accepted_tokens",
                                               "accepted_per_position", "requests")}  # fmt: skip
                results.append({
                    "temperature": temperature,
                    "command": " ".join(command),
                    "exit": run.returncode,
                    "mtpcheck": mine,
                    "vllm_metrics_difference": moved,
                    "equal": mine == moved,
                    "per_position_rate": [round(a / served["drafts"], 4)
                                          for a in served["accepted_per_position"]],
                    "mean_acceptance_length": served["mean_acceptance_length"]["value"],
                    "seconds": round(seconds, 1),
                })  # fmt: skip
            log = server.log.read_text(errors="replace")
        finally:
            launch.stop(server)
    lines = [
        line
        for line in log.splitlines()
        if any(
            s in line
            for s in (
                "Resolved architecture",
                "Loading drafter",
                "Loading weights took",
                "Detected EAGLE",
                "auxiliary layers",
                "EAGLE drafter KV",
                "speculative_config=",
                "[mtpcheck harness]",
                "serve_drafter.py",
            )
        )
    ]
    out = {"server_up_seconds": round(up, 1), "runs": results, "log_lines": lines}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
