"""The serving engines ``accept --server`` reads, as data: where each engine's speculative
decoding figures live, by the names its own source gives them.

One entry per engine: its ``/metrics`` counters (the sample names on the wire, with
``_total``), the request counter that tells whether anyone else's traffic moved them, the
per-request figures it puts in a completion response (and how a user turns them on), the
page that gives its version, and the source file and version the names were read from. A
name changes here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mtpcheck.accept.server_answers import count, counts, field


@dataclass(frozen=True)
class ServedRequest:
    """One request's speculative-decoding figures, whichever way they were read."""

    generated_tokens: int
    drafts: int | None
    """Verify steps that carried drafts (None where the engine does not count them)."""
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...] | None
    """Per position i: steps whose first i drafts were all accepted (None: not counted)."""


@dataclass(frozen=True)
class Counters:
    """An engine's Prometheus counters of speculative decoding (sample names)."""

    drafts: str | None
    """Verify steps with drafts; None where the engine counts them only as the drafts made at
    the first position (``drafted_per_position`` at position 0)."""
    draft_tokens: str
    accepted_tokens: str
    accepted_per_position: str | None
    """Per draft position, labelled ``position_label`` (0-based on the wire)."""
    position_label: str | None
    requests: str | None
    """Finished requests: it must move by exactly the requests mtpcheck sent. None where the
    engine counts none (llama.cpp): then ``generated_tokens`` must move by exactly the
    tokens mtpcheck's requests generated."""
    generated_tokens: str
    drafted_per_position: str | None = None
    """Drafts made per position, labelled ``position_label`` (TensorRT-LLM)."""
    other: tuple[str, ...] = ()
    """The engine's other speculative-decoding samples, known and not read (gauges)."""

    @property
    def traffic(self) -> str:
        """The counter that tells mtpcheck's requests from anyone else's."""
        return self.requests or self.generated_tokens


@dataclass(frozen=True)
class ServingEngine:
    """One serving engine: where its speculative-decoding figures live."""

    key: str
    """What ``--server-engine`` takes."""
    title: str
    metric_prefix: str
    """Every sample of the engine's ``/metrics`` starts with this."""
    counters: Counters | None
    """None where the engine's counters cannot be differenced (gauges of a recent window)."""
    per_request: Callable[[Mapping[str, Any]], ServedRequest | None] | None
    """The figures in one completion response, or None where that response has none."""
    per_request_how: str
    """How a user turns the per-request figures on."""
    version_page: str
    version_field: str
    source: str
    """Where the names come from: file and engine version."""
    metrics_page: str = "/metrics"
    request_extra: tuple[tuple[str, Any], ...] = ()
    """Fields a completion request needs for the engine to return its per-request figures."""
    per_request_field: str = ""
    """Where a completion response holds the per-request figures (empty: nowhere)."""
    counters_why_not: str = ""
    """Why the engine's counters cannot be differenced, where ``counters`` is None."""


_VLLM_FIELD = "metrics.speculative_decoding"
_SGLANG_FIELD = "sglext.spec_tokens_details"


def _vllm_request(response: Mapping[str, Any]) -> ServedRequest | None:
    """vLLM >= 0.32: ``metrics.speculative_decoding`` of a completion response
    (``SpeculativeDecodingMetrics``); ``acceptance_histogram[j]`` counts the verify steps
    that accepted exactly j drafts."""
    metrics = response.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    if not isinstance(spec, dict):
        return None
    what = _VLLM_FIELD + "."
    histogram = counts(field(spec, "acceptance_histogram"), what + "acceptance_histogram")
    return ServedRequest(
        generated_tokens=_generated(response),
        drafts=count(field(spec, "num_spec_steps"), what + "num_spec_steps"),
        draft_tokens=count(field(spec, "num_draft_tokens"), what + "num_draft_tokens"),
        accepted_tokens=count(
            field(spec, "num_accepted_draft_tokens"), what + "num_accepted_draft_tokens"
        ),
        accepted_per_position=_reached(histogram),
    )


def _generated(response: Mapping[str, Any]) -> int:
    """The tokens a completion generated (``usage.completion_tokens``)."""
    return count(field(response, "usage", "completion_tokens"), "usage.completion_tokens")


def _spec_decode_counters(prefix: str, requests: str | None, generated: str) -> Counters:
    """vLLM's speculative-decoding counters (``vllm/v1/spec_decode/metrics.py``) under
    ``prefix``: ``spec_decode_num_drafts_total`` and its kin, per position by ``position``."""
    return Counters(
        drafts=f"{prefix}spec_decode_num_drafts_total",
        draft_tokens=f"{prefix}spec_decode_num_draft_tokens_total",
        accepted_tokens=f"{prefix}spec_decode_num_accepted_tokens_total",
        accepted_per_position=f"{prefix}spec_decode_num_accepted_tokens_per_pos_total",
        position_label="position",
        requests=requests,
        generated_tokens=generated,
    )


VLLM = ServingEngine(
    key="vllm",
    title="vLLM",
    metric_prefix="vllm:",
    counters=_spec_decode_counters(
        "vllm:", requests="vllm:request_success_total", generated="vllm:generation_tokens_total"
    ),
    per_request=_vllm_request,
    per_request_how="vllm serve --per-request-spec-decode-metrics summary",
    per_request_field=_VLLM_FIELD,
    version_page="/version",
    version_field="version",
    source="vllm/v1/spec_decode/metrics.py, vllm/v1/metrics/loggers.py and "
    "vllm/entrypoints/generate/base/protocol.py (SpeculativeDecodingMetrics), vLLM 0.32.0",
)


def _reached(histogram: list[int]) -> tuple[int, ...]:
    """Steps whose first i drafts were all accepted, i = 1..k, from a histogram whose entry j
    counts the steps that accepted exactly j drafts."""
    return tuple(sum(histogram[i:]) for i in range(1, len(histogram)))


def _sglang_request(response: Mapping[str, Any]) -> ServedRequest | None:
    """SGLang 0.5.23: ``sglext.spec_tokens_details`` of a completion response asked with
    ``return_spec_tokens_details`` (``SpecTokensDetails``; the ``meta_info`` fields of
    ``/generate``)."""
    extension = response.get("sglext")
    details = extension.get("spec_tokens_details") if isinstance(extension, Mapping) else None
    if isinstance(details, list):  # one per choice with n > 1; mtpcheck asks for one
        details = details[0] if len(details) == 1 else None
    if not isinstance(details, dict) or "spec_verify_ct" not in details:
        return None
    what = _SGLANG_FIELD + "."
    histogram = counts(
        details.get("spec_correct_drafts_histogram") or [], what + "spec_correct_drafts_histogram"
    )
    return ServedRequest(
        generated_tokens=_generated(response),
        drafts=count(field(details, "spec_verify_ct"), what + "spec_verify_ct"),
        draft_tokens=count(
            field(details, "spec_num_proposed_drafts"), what + "spec_num_proposed_drafts"
        ),
        accepted_tokens=count(
            field(details, "spec_num_correct_drafts"), what + "spec_num_correct_drafts"
        ),
        accepted_per_position=_reached(histogram) if histogram else None,
    )


SGLANG = ServingEngine(
    key="sglang",
    title="SGLang",
    metric_prefix="sglang:",
    counters=None,
    counters_why_not="its /metrics has gauges of the last log interval and a verify-call "
    "counter, no count of accepted drafts to difference",
    per_request=_sglang_request,
    per_request_how="return_spec_tokens_details in the request (mtpcheck asks for it)",
    per_request_field=_SGLANG_FIELD,
    version_page="/server_info",
    version_field="version",
    source="sglang/srt/entrypoints/openai/protocol.py (SpecTokensDetails, "
    "return_spec_tokens_details) and sglang/srt/managers/tokenizer_manager.py (meta_info "
    "spec_*), SGLang 0.5.23; not run here (no CPU kernel on PyPI)",
    request_extra=(("return_spec_tokens_details", True),),
)

TRTLLM = ServingEngine(
    key="trtllm",
    title="TensorRT-LLM",
    metric_prefix="trtllm_",
    counters=Counters(
        drafts=None,
        draft_tokens="trtllm_spec_decode_num_draft_tokens_total",
        accepted_tokens="trtllm_spec_decode_num_accepted_tokens_total",
        accepted_per_position="trtllm_spec_decode_accepted_tokens_total",
        position_label="token_position",
        requests="trtllm_request_success_total",
        generated_tokens="trtllm_generation_tokens_total",
        drafted_per_position="trtllm_spec_decode_drafted_tokens_total",
        other=("trtllm_spec_decode_acceptance_length", "trtllm_spec_decode_draft_overhead"),
    ),
    per_request=None,
    per_request_how="nothing: trtllm-serve gives no per-request figures in a completion",
    version_page="/version",
    version_field="version",
    source="tensorrt_llm/metrics/collector.py (MetricsCollector, prefix trtllm_), "
    "TensorRT-LLM main after 1.2.1 (1.3.0rc); not run here (CUDA-only wheels)",
    metrics_page="/prometheus/metrics",
)

LLAMACPP = ServingEngine(
    key="llamacpp",
    title="llama.cpp",
    metric_prefix="llamacpp:",
    # llama-server names its counters after vLLM's
    counters=_spec_decode_counters(
        "llamacpp:", requests=None, generated="llamacpp:tokens_predicted_total"
    ),
    # a response's timings.draft_n / draft_n_accepted are totals: the positions and the
    # verify steps live only in /metrics, read request by request
    per_request=None,
    per_request_how="nothing: llama-server's responses carry totals, not positions",
    version_page="/props",
    version_field="build_info",
    source="tools/server/server-task.cpp (to_metrics) and tools/server/server-context.cpp, "
    "llama.cpp 0c1e57098 (llama-cpp-python 0.3.36); llama-server --metrics",
)

#: Every engine mtpcheck reads, by ``--server-engine`` name.
ENGINES: dict[str, ServingEngine] = {e.key: e for e in (VLLM, SGLANG, LLAMACPP, TRTLLM)}
