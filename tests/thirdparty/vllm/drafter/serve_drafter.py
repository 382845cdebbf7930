"""Start vLLM's OpenAI-compatible server on a target with a separate drafter, on CPU.

    .venv-vllm/bin/python tests/thirdparty/vllm/drafter/serve_drafter.py \
        tests/data/speculators/llama-target tests/data/speculators/eagle3 \
        --draft-tokens 3 [--method eagle3] [--port 8765] [--work-dir DIR] [--no-harness]

Copies both folders into the work directory (the server reads what it loads from there, so a
corpus regenerated meanwhile cannot change it under the server), then replaces itself
(os.execve, same pid) with

    python -m vllm.entrypoints.openai.api_server --model TARGET_COPY --host 127.0.0.1 ...
        --speculative-config '{"method": "eagle3", "model": DRAFTER_COPY,
                               "num_speculative_tokens": K}'

with the settings of ../server/serve.py (float32, eager, --max-model-len 128,
--kv-cache-memory-bytes 64 MiB, seed 0, --per-request-spec-decode-metrics detailed) and, unless
--no-harness, ../server/site on PYTHONPATH with MTPCHECK_VLLM_HARNESS=1, so that harness.py's
CPU patches (the rotary fix among them: the target has two heads) apply in every process of
the server. Start it in a session of its own and kill the process group to stop it
(drafter_launch.py does).
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent  # tests/thirdparty/vllm/drafter
SITE = HERE.parent / "server" / "site"


def server_argv(target: Path, drafter: Path, method: str, k: int, port: int) -> list[str]:
    """The server's command line."""
    spec = {"method": method, "model": str(drafter), "num_speculative_tokens": k}
    return [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(target),
        "--served-model-name", target.name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32",
        "--enforce-eager",
        "--max-model-len", "128",
        "--kv-cache-memory-bytes", str(64 << 20),
        "--seed", "0",
        "--speculative-config", json.dumps(spec),
        "--per-request-spec-decode-metrics", "detailed",
    ]  # fmt: skip


def copy(source: Path, work: Path) -> Path:
    """``source`` copied into ``work`` under its own name (replacing an earlier copy)."""
    out = work / source.name
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target", type=Path)
    p.add_argument("drafter", type=Path)
    p.add_argument("--draft-tokens", type=int, default=3)
    p.add_argument("--method", default="eagle3")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--no-harness", action="store_true")
    args = p.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="mtpcheck-vllm-drafter-"))
    work.mkdir(parents=True, exist_ok=True)
    target = copy(args.target.resolve(), work)
    drafter = copy(args.drafter.resolve(), work)
    if target.name == drafter.name:
        raise SystemExit("target and drafter folders need different names")

    env = dict(os.environ)
    env.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if not args.no_harness:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(SITE)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        env["MTPCHECK_VLLM_HARNESS"] = "1"
    argv = server_argv(target, drafter, args.method, args.draft_tokens, args.port)
    print("[serve_drafter.py]", " ".join(argv), file=sys.stderr, flush=True)
    os.execve(sys.executable, argv, env)


if __name__ == "__main__":
    main()
