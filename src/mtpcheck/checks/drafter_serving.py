"""How to serve a drafter with its target, engine by engine, from its kind's record: the
settings a user copies into vLLM, SGLang and llama.cpp (INFO findings, with the setting alone
in each finding's details for the JSON report)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mtpcheck.families.drafter_kinds import DrafterKind
from mtpcheck.families.drafters import draft_tokens, vllm_speculative_config
from mtpcheck.model import CheckName, CheckResult, Finding, Status


def _setting(engine: str, setting: str, note: str = "") -> Finding:
    message = setting + (f" ({note})" if note else "")
    return Finding(engine, Status.INFO, message, {"engine": engine, "setting": setting})


def serving_settings(kind: DrafterKind, config: Mapping[str, Any], drafter: str) -> CheckResult:
    """The settings each engine is given to draft with ``drafter``."""
    e = kind.engines
    findings = []
    if e.vllm:
        tokens = draft_tokens(config)
        spec = vllm_speculative_config(e.vllm, drafter, tokens)
        note = (
            e.vllm_note
            if tokens is not None
            else "; ".join(x for x in (e.vllm_note, "add num_speculative_tokens") if x)
        )
        findings.append(_setting("vLLM", f"--speculative-config '{json.dumps(spec)}'", note))
    if e.sglang:
        findings.append(
            _setting(
                "SGLang",
                f"--speculative-algorithm {e.sglang} --speculative-draft-model-path {drafter}",
            )
        )
    if e.llama_cpp:
        findings.append(
            _setting(
                "llama.cpp",
                f"-md DRAFTER.gguf --spec-type {e.llama_cpp}",
                "the drafter converted to GGUF by llama.cpp's converter",
            )
        )
    if e.other:
        findings.append(Finding("note", Status.INFO, e.other))
    if not findings:
        findings.append(Finding("engines", Status.SKIP, "no engine setting is known for it"))
    return CheckResult(CheckName.DRAFTER_SERVING, "How to serve the pair", tuple(findings))
