"""Whether the third-party converters of ``requirements.txt`` are installed.

Their tests skip where the tools are absent, so a bare ``pytest`` still runs everything else;
CI sets ``MTPCHECK_REQUIRE_THIRDPARTY=1``, which turns a missing tool into a failure.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REQUIRE = os.environ.get("MTPCHECK_REQUIRE_THIRDPARTY") == "1"
#: vLLM's CPU build lives in a venv of its own (it pins transformers < 5.20): the one
#: MTPCHECK_VLLM_VENV names, else the repository's .venv-vllm that .ci/run builds with
#: ``bash tests/thirdparty/vllm/install_venv.sh``.
VLLM_VENV = Path(os.environ.get("MTPCHECK_VLLM_VENV") or HERE.parent.parent / ".venv-vllm")
#: speculators 0.9.0's venv (tests/thirdparty/speculators/install_venv.sh; .ci/run makes it)
SPECULATORS_VENV = Path(
    os.environ.get("MTPCHECK_SPECULATORS_VENV") or HERE.parent.parent / ".venv-speculators"
)
#: llama.cpp's llama-server: the one MTPCHECK_LLAMA_SERVER names, else the repository's
#: .llama-server build that .ci/run makes with tests/thirdparty/llamacpp/server/build_server.sh.
LLAMA_SERVER = Path(
    os.environ.get("MTPCHECK_LLAMA_SERVER")
    or HERE.parent.parent / ".llama-server" / "build" / "bin" / "llama-server"
)


#: The tool outputs the corpus tests read: the shipped tests/data/<tool>, or, where
#: MTPCHECK_TOOL_OUTPUTS names a folder, <folder>/<tool> as the tools wrote it afresh
#: (.ci/run regenerates every corpus with tests/thirdparty/regenerate_corpora.sh).
TOOL_OUTPUTS = os.environ.get("MTPCHECK_TOOL_OUTPUTS")


def tool_output(tool: str) -> Path:
    """Where the corpus ``tool`` wrote is read from."""
    if TOOL_OUTPUTS:
        return Path(TOOL_OUTPUTS) / tool
    return HERE.parent / "data" / tool


def require(module: str) -> None:
    """Skip (or, in CI, fail) unless ``module`` can be imported."""
    if importlib.util.find_spec(module.split(".")[0]) is not None:
        try:
            if importlib.util.find_spec(module) is not None:
                return
        except ModuleNotFoundError:
            pass
    reason = f"{module} is not installed: pip install --no-deps -r {HERE / 'requirements.txt'}"
    if REQUIRE:
        pytest.fail(reason)
    pytest.skip(reason)


def script(name: str) -> str:
    """A shell command running one of the converter scripts beside this file."""
    return f"{sys.executable} {HERE / name}"
