"""The round trips the third-party converters drive, started together in the background.

Each is ``python -m mtpcheck roundtrip SRC --keep --format json`` with a tool's commands as its
two stages. Most of their time is spent importing torch, megatron-core and the tool, on one
core each, so they are started as soon as the test session knows it needs them and overlap with
each other and with the rest of the suite.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.conftest import FIXTURES
from tests.thirdparty.tools import require, script

BRIDGE = script("megatron_bridge_convert.py")
MBRIDGE = script("mbridge_convert.py")
TIMEOUT = 600


@dataclass(frozen=True)
class Spec:
    tool: str
    """The module the converter needs."""
    family: str
    to_megatron: str
    to_hf: str
    extra: tuple[str, ...] = ()


def _bridge(family: str) -> Spec:
    source = FIXTURES / family
    return Spec(
        "megatron.bridge",
        family,
        f"{BRIDGE} import {{src}} {{dst}}",
        f"{BRIDGE} export {{src}} {{dst}} --hf-reference {source}",
    )


def _mbridge(family: str, *flags: str) -> Spec:
    source = FIXTURES / family
    tail = "".join(f" {f}" for f in flags)
    return Spec(
        "mbridge",
        family,
        f"{MBRIDGE} import {{src}} {{dst}}{tail}",
        f"{MBRIDGE} export {{src}} {{dst}} --hf-config {source}{tail}",
        ("--all",),
    )


SPECS = {
    "bridge-deepseek_v3": _bridge("deepseek_v3"),
    "bridge-glm4_moe": _bridge("glm4_moe"),
    "mbridge-glm4_moe": _mbridge("glm4_moe"),
    "mbridge-mimo": _mbridge("mimo", "--compat"),
}


@dataclass(frozen=True)
class Kept:
    """One round trip's outcome and the checkpoints it kept."""

    exit_code: int
    stdout: str
    stderr: str
    report: dict[str, Any]
    megatron: Path
    hf: Path

    def __str__(self) -> str:
        return f"exit {self.exit_code}\n--- stderr\n{self.stderr[-4000:]}"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class Roundtrips:
    """Every round trip whose tool is installed, running in subprocesses from construction."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="mtpcheck-thirdparty-"))
        self._procs: dict[str, tuple[subprocess.Popen[bytes], IO[bytes], IO[bytes]]] = {}
        self._done: dict[str, Kept] = {}
        for name, spec in SPECS.items():
            if not _installed(spec.tool):
                continue
            work = self.root / name
            work.mkdir()
            out, err = open(work / "stdout", "w+b"), open(work / "stderr", "w+b")  # noqa: SIM115
            command = [
                sys.executable,
                "-m",
                "mtpcheck",
                "roundtrip",
                str(FIXTURES / spec.family),
                "--keep",
                "--workdir",
                str(work / "trip"),
                "--format",
                "json",
                "--to-megatron",
                spec.to_megatron,
                "--to-hf",
                spec.to_hf,
                *spec.extra,
            ]
            proc = subprocess.Popen(command, stdout=out, stderr=err)
            self._procs[name] = (proc, out, err)

    def get(self, name: str) -> Kept:
        """The finished round trip (skips, or fails in CI, when its tool is missing)."""
        require(SPECS[name].tool)
        if name not in self._done:
            proc, out, err = self._procs[name]
            code = proc.wait(timeout=TIMEOUT)
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(), err.read().decode()
            (kept,) = (self.root / name / "trip").iterdir()
            report = json.loads(stdout)
            self._done[name] = Kept(code, stdout, stderr, report, kept / "megatron", kept / "hf")
        return self._done[name]

    def close(self) -> None:
        for proc, out, err in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            out.close()
            err.close()
        shutil.rmtree(self.root, ignore_errors=True)


def statuses(report: dict[str, Any]) -> dict[str, str]:
    """Check name -> status of a JSON report."""
    return {c["name"]: c["status"] for c in report["checks"]}


def findings(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    (found,) = [c for c in report["checks"] if c["name"] == check]
    return list(found["findings"])


def failing(report: dict[str, Any], check: str) -> dict[str, str]:
    """Subject -> message of the failed findings of one check."""
    return {f["subject"]: f["message"] for f in findings(report, check) if f["status"] == "fail"}
