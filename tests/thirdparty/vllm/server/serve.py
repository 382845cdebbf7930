"""Start vLLM's OpenAI-compatible server on a fixture copy, on CPU, with harness.py's patches.

    .venv-vllm/bin/python tests/thirdparty/vllm/server/serve.py fixtures/accept_deepseek_v3 \
        --draft-tokens 1 [--port 8765] [--work-dir DIR] [--skip-patch rope]

(--draft-tokens 0: no speculative decoding.)

Makes the config-patched copy (harness_fixture.prepare_fixture, patch 1), then replaces
itself (os.execve, same pid) with

    python -m vllm.entrypoints.openai.api_server --model COPY --host 127.0.0.1 ...

with PYTHONPATH=server/site (its sitecustomize.py imports harness.py in every interpreter,
including the engine-core process that vLLM spawns) and MTPCHECK_VLLM_HARNESS=1. Start it in
a session of its own and kill the process group to stop it (probe.py does).
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent  # tests/thirdparty/vllm/server
sys.path.insert(0, str(HERE.parent))
from harness_fixture import prepare_fixture  # noqa: E402  (standard library only)


def server_argv(model: Path, k: int, port: int) -> list[str]:
    """The server's command line: the same engine settings as run_vllm.py's vllm.LLM(...)."""
    config = json.loads((model / "config.json").read_text())
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model),
        "--served-model-name", model.name,  # not the copy's path: the same on every machine
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32",
        "--enforce-eager",
        "--max-model-len", "128",
        "--kv-cache-memory-bytes", str(64 << 20),
        "--seed", "0",
    ]  # fmt: skip
    if k > 0:  # k = 0: a server without speculative decoding (vLLM then refuses the flag)
        argv += ["--speculative-config",
                 json.dumps({"method": "mtp", "num_speculative_tokens": k}),
                 # per-request figures in each response, metrics.speculative_decoding
                 "--per-request-spec-decode-metrics", "detailed"]  # fmt: skip
    if "vision_config" in config:  # Step-3.7: text-only prompts, no vision tower
        argv.append("--language-model-only")
    return argv


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("fixture", type=Path)
    p.add_argument("--draft-tokens", type=int, required=True)
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--work-dir", type=Path, default=None)
    p.add_argument("--skip-patch", action="append", default=[])
    args = p.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="mtpcheck-vllm-serve-"))
    work.mkdir(parents=True, exist_ok=True)
    model = prepare_fixture(args.fixture, work)

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HERE / "site")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["MTPCHECK_VLLM_HARNESS"] = "1"
    if args.skip_patch:
        env["MTPCHECK_VLLM_SKIP_PATCHES"] = ",".join(args.skip_patch)
    argv = server_argv(model, args.draft_tokens, args.port)
    print("[serve.py]", " ".join(argv), file=sys.stderr, flush=True)
    os.execve(sys.executable, argv, env)


if __name__ == "__main__":
    main()
