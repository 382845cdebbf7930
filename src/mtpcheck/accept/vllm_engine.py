"""``accept --engine vllm``: run the workloads through vLLM's MTP speculative decoding and read
vLLM's own counters.

vLLM runs in a child process, in the interpreter ``--vllm-python`` names (default: this one),
executing :mod:`mtpcheck.accept.vllm_driver` by its file path, so a vLLM installed in a venv
of its own (its pins often clash with a converter's) works as well as ``mtpcheck[vllm]``.
Request and result travel as JSON files; vLLM's log goes to ``--engine-log`` or nowhere, never
to mtpcheck's stdout or stderr.

What is read (vLLM >= 0.32, the metrics API ``LLM.get_metrics()``):
``vllm:spec_decode_num_drafts``, ``vllm:spec_decode_num_draft_tokens``,
``vllm:spec_decode_num_accepted_tokens`` and ``vllm:spec_decode_num_accepted_tokens_per_pos``,
plus every request's ``CompletionOutput.spec_decode_metrics`` (``acceptance_histogram``,
``per_step_accepted``), whose sums must equal the counters.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpcheck.accept.options import VllmSettings
from mtpcheck.errors import InputError, MtpcheckError

DRIVER = Path(__file__).with_name("vllm_driver.py")


@dataclass(frozen=True)
class EngineRequest:
    """One request as vLLM ran it."""

    generated: tuple[int, ...]
    accepted_per_step: tuple[int, ...]
    """Drafts accepted at each verify step, in order (0..k)."""
    draft_tokens: int

    @property
    def steps(self) -> int:
        """Verify steps that carried drafts."""
        return len(self.accepted_per_step)

    @property
    def accepted(self) -> int:
        """Drafts accepted over all steps."""
        return sum(self.accepted_per_step)

    def reached(self, position: int) -> int:
        """Steps whose drafts 1..``position`` were all accepted (vLLM's per-position count)."""
        return sum(a >= position for a in self.accepted_per_step)


@dataclass(frozen=True)
class EngineRun:
    """One vLLM run over every prompt: its global speculative-decoding counters (which the
    per-request figures must add up to) and each request."""

    version: str
    """vLLM's version, as it reports it."""
    k: int
    requests: tuple[EngineRequest, ...]
    seconds: float
    """The time vLLM's parts took, together."""
    drafts: int
    """Verify steps that carried drafts, all requests together."""
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]
    """Per position 1..k: steps whose first i drafts were all accepted."""


def _language_model_only(config: dict[str, Any]) -> bool:
    """A vision-language checkpoint measured on text prompts runs without its vision tower."""
    return "vision_config" in config


def run_vllm(
    model_dir: Path,
    config: dict[str, Any],
    prompts: list[list[int]],
    k: int,
    new_tokens: int,
    temperature: float,
    settings: VllmSettings,
    seed: int = 0,
    speculative_config: dict[str, Any] | None = None,
) -> EngineRun:
    """Generate ``new_tokens`` after each prompt with vLLM's MTP speculative decoding (k
    drafts a step), or with ``speculative_config`` (a separate drafter's), and return its
    counters; every failure is one line (exit 2)."""
    python = settings.python
    if os.sep in python and not os.access(python, os.X_OK):
        raise InputError(python, "--vllm-python: not an executable file")
    request = {
        "model": str(model_dir),
        "prompts": prompts,
        "k": k,
        "new_tokens": new_tokens,
        "temperature": temperature,
        "seed": seed,
        "dtype": settings.dtype,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "pipeline_parallel_size": settings.pipeline_parallel_size,
        "distributed_executor_backend": settings.executor,
        "language_model_only": _language_model_only(config),
        "extra": dict(settings.extra),
    }
    if speculative_config is not None:
        request["speculative_config"] = speculative_config
    with tempfile.TemporaryDirectory(prefix="mtpcheck-vllm-") as work:
        request_path, result_path = Path(work, "request.json"), Path(work, "result.json")
        request_path.write_text(json.dumps(request), encoding="utf-8")
        log_path = settings.log or Path(work, "vllm.log")
        try:
            with open(log_path, "w", encoding="utf-8") as log:
                done = subprocess.run(
                    [python, str(DRIVER), str(request_path), str(result_path)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
        except FileNotFoundError as e:
            raise InputError(python, "--vllm-python: no such interpreter") from e
        except OSError as e:
            raise InputError(python, f"--vllm-python: cannot run it ({e.strerror})") from e
        if not result_path.exists():
            raise MtpcheckError(
                f"vLLM ({python}) exited with status {done.returncode} without a result: "
                f"{_last_line(log_path)}"
                + (f" (its log: {settings.log})" if settings.log else " (--engine-log keeps it)")
            )
        result = json.loads(result_path.read_text(encoding="utf-8"))
    if "error" in result:
        raise MtpcheckError(result["error"])
    return _engine_run(result, k, len(prompts))


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    lines = [ln for ln in lines if ln]
    return lines[-1] if lines else "no output"


def _engine_run(result: dict[str, Any], k: int, prompts: int) -> EngineRun:
    version = result["vllm_version"]
    counters = result["counters"]
    requests = []
    for entry in result["requests"]:
        if "per_step_accepted" not in entry:
            raise MtpcheckError(
                f"vLLM {version} returned no per-request spec-decode metrics (is MTP "
                "speculative decoding on for this model?)"
            )
        requests.append(
            EngineRequest(
                tuple(entry["generated"]), tuple(entry["per_step_accepted"]), entry["draft_tokens"]
            )
        )
    if len(requests) != prompts:
        raise MtpcheckError(
            f"vLLM {version} returned {len(requests)} outputs for {prompts} prompts"
        )
    per_position = tuple(counters["accepted_per_pos"]) + (0,) * max(
        0, k - len(counters["accepted_per_pos"])
    )
    run = EngineRun(
        version=version,
        k=k,
        drafts=counters["drafts"],
        draft_tokens=counters["draft_tokens"],
        accepted_tokens=counters["accepted_tokens"],
        accepted_per_position=per_position[:k],
        requests=tuple(requests),
        seconds=sum(result["seconds"].values()),
    )
    _check_sums(run, result.get("metrics_found", []))
    return run


def _check_sums(run: EngineRun, found: list[str]) -> None:
    """vLLM's per-request metrics must add up to its global counters: both are read, the
    intervals come from the former and the figures from the latter."""
    steps = sum(r.steps for r in run.requests)
    if run.drafts == 0 and steps == 0:
        raise MtpcheckError(
            f"vLLM {run.version} drafted nothing (spec-decode metrics found: "
            f"{', '.join(found) or 'none'})"
        )
    per_position = tuple(sum(r.reached(i) for r in run.requests) for i in range(1, run.k + 1))
    sums = (steps, sum(r.draft_tokens for r in run.requests), per_position, sum(per_position))
    counted = (run.drafts, run.draft_tokens, run.accepted_per_position, run.accepted_tokens)
    if sums != counted:
        raise MtpcheckError(
            f"vLLM {run.version}'s per-request spec-decode metrics {sums} do not add up to its "
            f"counters {counted} (steps, draft tokens, accepted per position, accepted)"
        )
