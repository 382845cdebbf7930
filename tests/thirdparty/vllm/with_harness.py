"""``python with_harness.py SCRIPT ARGS...``: import ``harness`` (the test-harness patches of
NOTES.md, which also keep vLLM's engine in this process), then run SCRIPT as ``__main__``."""

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402, F401

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
