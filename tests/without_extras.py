"""Run mtpcheck as the core install would, in a fresh interpreter where the packages of the
extras cannot be imported (an import finder refuses them, as a missing package would)."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "transformers", "megatron", "matplotlib", "safetensors", "vllm", "accelerate")
"""Top-level packages that only the extras bring."""

_BLOCK = """
import sys

class _Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {heavy!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Missing())
from mtpcheck.cli import main

code = main({argv!r})
imported = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
print("IMPORTED", imported, file=sys.stderr)
sys.exit(code)
"""


def run_core(*argv: str, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """``mtpcheck ARGV`` without the extras' packages; stderr ends with the line
    ``IMPORTED [...]`` listing any of them that got imported (none can)."""
    code = _BLOCK.format(heavy=set(HEAVY), argv=list(argv))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=cwd
    )


def stderr_lines(run: subprocess.CompletedProcess[str]) -> list[str]:
    """stderr without the ``IMPORTED`` line."""
    lines = run.stderr.splitlines()
    assert lines and lines[-1] == "IMPORTED []", run.stderr
    return lines[:-1]
