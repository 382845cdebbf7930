"""Run prompts through vLLM's offline engine with speculative decoding (the model's MTP
layers, or a separate drafter the request names); write its counters.

    PYTHON vllm_driver.py REQUEST.json RESULT.json

This file runs in the interpreter that has vLLM (``accept --vllm-python``), which is often
not mtpcheck's: it imports nothing but the standard library and vLLM, and talks to
``mtpcheck.accept.vllm_engine`` through two JSON files. vLLM's own log goes to stderr.

The request names the model folder, the prompts (token ids, so both sides see the same ids),
the number of draft tokens k, sampling, parallelism and any further ``vllm.LLM`` arguments.
The result holds vLLM's version, the spec-decode counters of its metrics API
(``LLM.get_metrics()``: the difference of the snapshots after and before ``generate``, summed
over engines), and per request the generated ids and vLLM's per-request spec-decode metrics
(``per_request_spec_decode_metrics="detailed"``: the accepted drafts of every verify step).
A failure writes ``{"error": "<one line>"}`` and exits 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

MIN_VERSION = (0, 32)
"""The first vLLM whose per-request spec-decode metrics this driver reads."""

METRICS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
    "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos",
}


class DriverError(Exception):
    """A reason the run cannot go on, in one line."""


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise DriverError(f"vLLM is not installed in {sys.executable} ({e})") from e
    version = getattr(vllm, "__version__", "unknown")
    if _version_tuple(version) < MIN_VERSION:
        wanted = ".".join(map(str, MIN_VERSION))
        raise DriverError(
            f"vLLM {version} in {sys.executable} is too old: per-request spec-decode metrics "
            f"need vLLM >= {wanted}"
        )
    return vllm


def _snapshot(llm: Any) -> dict[str, Any]:
    """The spec-decode counters of one metrics snapshot, summed over engines."""
    from vllm.v1.metrics.reader import Counter, Vector

    out: dict[str, Any] = {
        "drafts": 0,
        "draft_tokens": 0,
        "accepted_tokens": 0,
        "accepted_per_pos": [],
    }
    found = set()
    for metric in llm.get_metrics():
        for key, name in METRICS.items():
            if metric.name != name:
                continue
            found.add(name)
            if isinstance(metric, Vector):
                values, acc = [int(v) for v in metric.values], out[key]
                width = max(len(values), len(acc))
                values += [0] * (width - len(values))
                out[key] = [v + (acc[i] if i < len(acc) else 0) for i, v in enumerate(values)]
            elif isinstance(metric, Counter):
                out[key] += int(metric.value)
    out["found"] = sorted(found)
    return out


def _difference(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    per_pos = list(after["accepted_per_pos"])
    for i, value in enumerate(before["accepted_per_pos"]):
        per_pos[i] -= value
    return {
        "drafts": after["drafts"] - before["drafts"],
        "draft_tokens": after["draft_tokens"] - before["draft_tokens"],
        "accepted_tokens": after["accepted_tokens"] - before["accepted_tokens"],
        "accepted_per_pos": per_pos,
    }


#: How much of an error message the one line keeps.
_MESSAGE_CHARS = 600


def _one_line(e: BaseException) -> str:
    """The whole message on one line. vLLM's configs are pydantic dataclasses, whose errors
    put the cause in the middle lines and a link in the last (``For further information
    visit https://errors.pydantic.dev/...``): the link is dropped, the cause kept."""
    lines = [ln.strip() for ln in str(e).strip().splitlines()]
    kept = [ln for ln in lines if ln and not ln.startswith("For further information visit")]
    text = " ".join(kept)
    if len(text) > _MESSAGE_CHARS:
        text = text[: _MESSAGE_CHARS - 3] + "..."
    return f"{type(e).__name__}: {text}".rstrip(": ")


def run(request: dict[str, Any]) -> dict[str, Any]:
    """Generate for every prompt of ``request`` with MTP speculative decoding: each
    request's output and per-step figures, and the counters' change over the run."""
    vllm = _import_vllm()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    k = int(request["k"])
    kwargs = {
        "model": request["model"],
        "tokenizer": request.get("tokenizer") or request["model"],
        "dtype": request.get("dtype", "auto"),
        "seed": int(request.get("seed", 0)),
        "tensor_parallel_size": int(request.get("tensor_parallel_size", 1)),
        "pipeline_parallel_size": int(request.get("pipeline_parallel_size", 1)),
        "disable_log_stats": False,  # with it on (LLM's default) the counters stay at 0
        # a separate drafter's {"method": ..., "model": DRAFTER, ...}, else the model's MTP
        "speculative_config": request.get("speculative_config")
        or {"method": "mtp", "num_speculative_tokens": k},
        "per_request_spec_decode_metrics": "detailed",
    }
    if request.get("distributed_executor_backend"):
        kwargs["distributed_executor_backend"] = request["distributed_executor_backend"]
    if request.get("language_model_only"):
        kwargs["language_model_only"] = True
    kwargs.update(request.get("extra", {}))

    spec = kwargs["speculative_config"]
    how = (
        "MTP speculative decoding"
        if spec.get("method") == "mtp" and "model" not in spec
        else f"speculative decoding method {spec.get('method')!r} (drafter {spec.get('model')})"
    )
    started = time.monotonic()
    try:
        llm = LLM(**kwargs)
    except Exception as e:  # vLLM raises many kinds; the user needs the reason, in one line
        raise DriverError(
            f"vLLM {vllm.__version__} could not start the model with {how} (k={k}): {_one_line(e)}"
        ) from e
    built = time.monotonic()
    params = SamplingParams(
        temperature=float(request.get("temperature", 0.0)),
        max_tokens=int(request["new_tokens"]),
        seed=int(request.get("seed", 0)),
        ignore_eos=bool(request.get("ignore_eos", False)),
    )
    before = _snapshot(llm)
    try:
        outputs = llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in request["prompts"]],
            params,
            use_tqdm=False,
        )
    except Exception as e:
        raise DriverError(f"vLLM {vllm.__version__} failed while generating: {_one_line(e)}") from e
    after = _snapshot(llm)
    done = time.monotonic()

    requests = []
    for out in outputs:
        completion = out.outputs[0]
        metrics = completion.spec_decode_metrics
        entry: dict[str, Any] = {"generated": [int(t) for t in completion.token_ids]}
        if metrics is not None:
            d = metrics.to_dict()
            entry["histogram"] = [int(v) for v in d["acceptance_histogram"]]
            entry["draft_tokens"] = int(d["num_draft_tokens"])
            entry["per_step_accepted"] = [int(v) for v in d.get("per_step_accepted", [])]
        requests.append(entry)
    return {
        "vllm_version": vllm.__version__,
        "python": sys.executable,
        "metrics_found": after["found"],
        "counters": _difference(before, after),
        "requests": requests,
        "seconds": {"engine_start": built - started, "generate": done - built},
    }


def main(argv: list[str]) -> int:
    """``vllm_driver.py REQUEST.json RESULT.json``: the exit code (2: bad usage or vLLM failed)."""
    if len(argv) != 3:
        print("usage: vllm_driver.py REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    # vLLM logs to stdout unless told otherwise; stdout is not read, but keep it quiet
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    with open(argv[1], encoding="utf-8") as f:
        request = json.load(f)
    try:
        result = run(request)
        code = 0
    except DriverError as e:
        result, code = {"error": str(e)}, 2
    with open(argv[2], "w", encoding="utf-8") as f:
        json.dump(result, f)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
