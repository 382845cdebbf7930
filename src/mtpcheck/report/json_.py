"""Machine-readable JSON report (``schema_version`` 1): its JSON Schema ships beside it as
``report.schema.json``, and docs/report.md describes its fields."""

from __future__ import annotations

import json
from typing import Any, TextIO

from mtpcheck import __version__
from mtpcheck.model import (
    AcceptanceDelta,
    AcceptanceResult,
    ChainAcceptance,
    CheckpointSummary,
    EngineAcceptance,
    Estimate,
    OnlineAcceptance,
    Report,
    ServerAcceptance,
    Share,
    TensorComparison,
)

SCHEMA_VERSION = 2


def _input(s: CheckpointSummary) -> dict[str, Any]:
    return {
        "path": s.path,
        "format": s.format,
        "family": s.family,
        "family_display": s.family_display,
        "model_type": s.model_type,
        "declared_mtp_layers": s.declared_mtp,
        "declared_by": s.declared_by,
        "num_hidden_layers": s.num_hidden_layers,
        "tensor_count": s.tensor_count,
        "total_bytes": s.total_bytes,
        "mtp_layers": [
            {
                "index": layer.index,
                "prefix": layer.prefix,
                "complete": layer.complete,
                "tensors": list(layer.present),
                "missing": list(layer.missing),
                "unreadable": list(layer.unreadable),
                "nbytes": layer.nbytes,
                "dtypes": list(layer.dtypes),
            }
            for layer in s.mtp_layers
        ],
    }


def _tensor(c: TensorComparison) -> dict[str, Any]:
    row = _plain_tensor(c)
    if c.storage is not None:
        row["storage"] = list(c.storage)
        row["steps"] = c.steps
    return row


def _plain_tensor(c: TensorComparison) -> dict[str, Any]:
    return {
        "name": c.name,
        "status": c.status.value,
        "dtype": list(c.dtype),
        "shape": [list(s) if s is not None else None for s in c.shape],
        "nbytes": c.nbytes,
        "differing_elements": c.differing_elements,
        "first_difference": list(c.first_difference) if c.first_difference else None,
        "max_abs_diff": c.max_abs_diff,
        "values_differing": c.values_differing,
    }


def _ci(e: Estimate) -> list[float | None]:
    return [e.low, e.high]


def _estimate(e: Estimate) -> dict[str, float | None]:
    return {"value": e.value, "low": e.low, "high": e.high}


def _acceptance(r: AcceptanceResult) -> dict[str, Any]:
    return {
        "checkpoint": r.checkpoint,
        "workload": r.workload,
        "drafter": r.drafter,
        "note": r.note,
        "sequences": r.sequences,
        "positions": r.positions,
        "greedy_hits": r.greedy_hits,
        "greedy": r.greedy.value,
        "greedy_ci": _ci(r.greedy),
        "alpha": r.alpha.value,
        "alpha_ci": _ci(r.alpha),
        "tokens_per_pass": r.tokens_per_pass,
        "temperature": r.temperature,
        "chain": _chain(r.chain) if r.chain is not None else None,
    }


def _chain(c: ChainAcceptance) -> dict[str, Any]:
    return {
        "hidden": c.hidden,
        "positions": c.positions,
        "depths": [
            {
                "depth": d.depth,
                "greedy": d.greedy.value,
                "greedy_ci": _ci(d.greedy),
                "alpha": d.alpha.value,
                "alpha_ci": _ci(d.alpha),
                "tokens_per_pass": d.tokens_per_pass,
            }
            for d in c.depths
        ],
        "tokens_per_pass": c.tokens_per_pass.value,
        "tokens_per_pass_ci": _ci(c.tokens_per_pass),
        "greedy_tokens_per_pass": c.greedy_tokens_per_pass,
    }


def _delta(d: AcceptanceDelta) -> dict[str, Any]:
    return {
        "workload": d.workload,
        "greedy": d.greedy.value,
        "greedy_ci": _ci(d.greedy),
        "alpha": d.alpha.value,
        "alpha_ci": _ci(d.alpha),
        "tokens_per_pass": d.tokens_per_pass,
    }


def report_dict(report: Report) -> dict[str, Any]:
    result = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "mtpcheck", "version": __version__},
        "command": report.command,
        "ok": report.ok,
        "inputs": [_input(s) for s in report.inputs],
        "checks": [
            {
                "name": c.name,
                "title": c.title,
                "status": c.status.value,
                "findings": [
                    {
                        "subject": f.subject,
                        "status": f.status.value,
                        "message": f.message,
                        "details": dict(f.details),
                    }
                    for f in c.findings
                ],
            }
            for c in report.checks
        ],
        "tensors": [_tensor(c) for c in report.tensors],
    }
    if report.command == "accept":
        result["acceptance"] = [_acceptance(r) for r in report.acceptance]
        result["acceptance_deltas"] = [_delta(d) for d in report.acceptance_deltas]
        result["online_acceptance"] = [_online(o) for o in report.online]
        result["engine_acceptance"] = [_engine(e) for e in report.engine]
        result["engine_deltas"] = [
            {
                "workload": d.workload,
                "first_position": _estimate(d.first_position),
                "mean_acceptance_length": _estimate(d.mean_acceptance_length),
            }
            for d in report.engine_deltas
        ]
        result["server_acceptance"] = [_server(r) for r in report.server]
    return result


def _share(s: Share) -> dict[str, Any]:
    return {**_estimate(s.estimate), "error": s.error}


def _server(r: ServerAcceptance) -> dict[str, Any]:
    length = r.mean_acceptance_length
    return {
        "workload": r.workload,
        "engine": r.engine,
        "server": r.server,
        "model": r.model,
        "source": r.source,
        "k": r.k,
        "temperature": r.temperature,
        "requests": r.requests,
        "prompt_tokens": r.prompt_tokens,
        "new_tokens": r.new_tokens,
        "generated_tokens": r.generated_tokens,
        "drafts": r.drafts,
        "draft_tokens": r.draft_tokens,
        "accepted_tokens": r.accepted_tokens,
        "accepted_per_position": list(r.accepted_per_position),
        "by_position": [_share(s) for s in r.by_position],
        "acceptance": _share(r.acceptance),
        "mean_acceptance_length": None if length is None else _estimate(length),
        "expected": [_share(s) for s in r.expected],
    }


def _engine(e: EngineAcceptance) -> dict[str, Any]:
    return {
        "checkpoint": e.checkpoint,
        "workload": e.workload,
        "engine": e.engine,
        "parallel": e.parallel,
        "k": e.k,
        "temperature": e.temperature,
        "requests": e.requests,
        "prompt_tokens": e.prompt_tokens,
        "new_tokens": e.new_tokens,
        "generated_tokens": e.generated_tokens,
        "drafts": e.drafts,
        "draft_tokens": e.draft_tokens,
        "accepted_tokens": e.accepted_tokens,
        "acceptance": e.acceptance,
        "accepted_per_position": list(e.accepted_per_position),
        "by_position": [_estimate(p) for p in e.by_position],
        "mean_acceptance_length": _estimate(e.mean_acceptance_length),
        "teacher_forced": list(e.teacher_forced),
        "agreeing": e.agreeing,
    }


def _online(o: OnlineAcceptance) -> dict[str, Any]:
    return {
        "checkpoint": o.checkpoint,
        "workload": o.workload,
        "temperature": o.temperature,
        "sequences": o.sequences,
        "prompt_tokens": o.prompt_tokens,
        "new_tokens": o.new_tokens,
        "drafts": o.drafts,
        "accepted_tokens": o.accepted_tokens,
        "online": o.online,
        "tokens_per_pass": o.tokens_per_pass,
        "teacher_forced": o.teacher_forced,
        "agreeing": o.agreeing,
        "k": o.k,
        "accepted_per_position": list(o.accepted_per_depth or (o.accepted,)),
        "teacher_forced_per_depth": list(o.teacher_forced_per_depth),
        "draft_rule": o.draft_rule,
        "engine": o.engine,
        "in_output": o.in_output,
    }


def error_dict(command: str, path: str, reason: str) -> dict[str, Any]:
    """The JSON printed instead of a report when an input cannot be read (exit 2)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "mtpcheck", "version": __version__},
        "command": command,
        "ok": False,
        "error": {"path": path, "reason": reason},
    }


class JsonRenderer:
    name = "json"

    def render(self, report: Report, stream: TextIO) -> None:
        json.dump(report_dict(report), stream, indent=2)
        stream.write("\n")
