"""Start mtpcheck as a separate process, alone or as the ranks of a torchrun job on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    """This environment minus any torchrun rank variables, with the source tree importable."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


def torchrun(
    *args: str | Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc-per-node 2 -m mtpcheck ARGS`` on loopback (``env``: added)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd += ["-m", "mtpcheck", *map(str, args)]
    return subprocess.run(
        cmd, capture_output=True, text=True, env={**child_env(), **(env or {})}, timeout=timeout
    )
