"""Start and stop vLLM's OpenAI server on a target with a separate drafter, for the tests
(standard library only).

:func:`start` runs ``serve_drafter.py`` in vLLM's venv, in a session of its own on 127.0.0.1
and a free port, under ``timeout`` (the server ends by itself after ``lifetime`` seconds
whatever happens to the caller); ``ready`` and ``stop`` are ``../server/launch.py``'s (wait
for ``/health`` within a bound; TERM, then KILL, the whole process group).
:func:`spec_counters` reads vLLM's speculative-decoding counters from ``/metrics``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "server"))
try:
    from launch import Launched, free_port, ready, stop, tail  # noqa: E402
finally:
    sys.path.pop(0)

__all__ = ["Launched", "ready", "spec_counters", "start", "stop", "tail"]

#: vLLM 0.32's speculative-decoding counters (vllm/v1/spec_decode/metrics.py) and its
#: finished-request counter, as Prometheus samples.
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
REQUESTS = "vllm:request_success_total"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")


def start(
    venv: Path,
    target: Path,
    drafter: Path,
    k: int,
    work: Path,
    method: str = "eagle3",
    port: int | None = None,
    lifetime: int = 900,
) -> Launched:
    """``serve_drafter.py TARGET DRAFTER --draft-tokens K --method METHOD`` on ``port`` or a
    free one, killed after ``lifetime`` seconds at the latest."""
    work.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    argv = ["timeout", "-s", "KILL", str(lifetime),
            str(venv / "bin" / "python"), str(HERE / "serve_drafter.py"), str(target),
            str(drafter), "--draft-tokens", str(k), "--method", method, "--port", str(port),
            "--work-dir", str(work)]  # fmt: skip
    log = work / "server.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return Launched(f"http://127.0.0.1:{port}", process, log)


def spec_counters(url: str) -> dict[str, object]:
    """vLLM's own figures on ``url``'s ``/metrics``, summed over engines: ``drafts``,
    ``draft_tokens``, ``accepted_tokens``, ``accepted_per_position`` (list, position 0
    first) and ``requests`` (finished, every reason)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        page = response.read().decode()
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0, REQUESTS: 0.0}
    positions: dict[int, float] = {}
    for line in page.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), m.group(2) or "", float(m.group(3))
        if name in totals:
            totals[name] += value
        elif name == PER_POSITION:
            position = int(re.search(r'position="(\d+)"', labels).group(1))  # type: ignore[union-attr]
            positions[position] = positions.get(position, 0.0) + value
    return {
        "drafts": int(totals[DRAFTS]),
        "draft_tokens": int(totals[DRAFT_TOKENS]),
        "accepted_tokens": int(totals[ACCEPTED]),
        "accepted_per_position": [int(positions[i]) for i in sorted(positions)],
        "requests": int(totals[REQUESTS]),
    }


def difference(after: dict[str, object], before: dict[str, object]) -> dict[str, object]:
    """``after - before``, per counter and per position."""
    out: dict[str, object] = {}
    for key, value in after.items():
        if isinstance(value, list):
            earlier = before[key]
            assert isinstance(earlier, list)
            out[key] = [a - b for a, b in zip(value, earlier, strict=True)]
        else:
            out[key] = value - before[key]  # type: ignore[operator]
    return out
