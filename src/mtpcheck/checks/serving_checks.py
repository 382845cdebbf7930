"""``serving``: will a serving engine build, from this config, the model that was trained?

Pure: reads the config only. Per family, the keys an engine reads with defaults of its own
(:mod:`mtpcheck.families.serving`): an absent key whose engine default is not what
transformers builds is a WARN (the checkpoint is intact; the engine's default is at fault,
and engines change defaults between versions); a value the config states that makes the
engine build something else, or that the engine refuses, is a FAIL.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from mtpcheck.families import MtpAnalysis
from mtpcheck.families.interface import Serving
from mtpcheck.families.serving import EngineDefault, EngineLimit, EngineSource
from mtpcheck.model import CheckName, CheckResult, Finding, Status
from mtpcheck.model.config_keys import text_value

TITLE = "What serving engines build from this config"
_ABSENT = object()


def serving_check(
    config: Mapping[str, Any], analysis: MtpAnalysis, names: Collection[str]
) -> CheckResult:
    """What the serving engines known to read this family differently from transformers build
    from its config: defaults they assume, limits they apply, stored copies they skip."""
    family = analysis.family
    serving = family.serving if family is not None else Serving()
    maybe = [
        *(_default(config, d, names) for d in serving.defaults),
        *(_limit(config, limit) for limit in serving.limits),
    ]
    findings = [f for f in maybe if f is not None]
    if analysis.copies:
        findings.extend(
            Finding(
                "mtp copies",
                Status.INFO,
                f"{copies.source.engine} drafts through the main embedding and head, not the "
                f"MTP layer's stored copies ({copies.source.file})",
                {"engine": copies.source.engine},
            )
            for copies in serving.stored_copies
            if not copies.uses_stored
        )
    if not any(f.status in (Status.FAIL, Status.WARN) for f in findings):
        sources = [*(d.source for d in serving.defaults), *(lim.source for lim in serving.limits)]
        known = sorted({source.engine for source in sources})
        message = (
            f"{' and '.join(known)} {'build' if len(known) > 1 else 'builds'} what "
            "transformers builds from this config"
            if known
            else "no engine reading known to differ from transformers for this family"
        )
        findings.insert(0, Finding("serving", Status.PASS if known else Status.SKIP, message))
    return CheckResult(CheckName.SERVING, TITLE, tuple(findings))


def _value(config: Mapping[str, Any], key: str) -> object:
    found = text_value(config, key)
    return _ABSENT if found is None else found[1]


def _default(config: Mapping[str, Any], d: EngineDefault, names: Collection[str]) -> Finding | None:
    value = _value(config, d.key)
    details = _details(d.source, d.key)
    if value is _ABSENT:
        if d.engine_default == d.trained:
            return None
        effect = d.effect
        if d.refused_with and any(n.endswith(d.refused_with) for n in names):
            effect = f"refuses to load the checkpoint, which stores {d.refused_with} ({d.refusal})"
        return Finding(
            d.key,
            Status.WARN,
            f"absent: {d.source.engine} reads it as {d.engine_default!r} ({d.source.file}) and "
            f"{effect}; transformers builds {d.trained!r} "
            f"(add {json.dumps({d.key: d.trained})[1:-1]})",
            details,
        )
    if value == d.trained:
        return None
    return Finding(
        d.key,
        Status.FAIL,
        f"{value!r}: {d.source.engine} builds with it ({d.source.file}), transformers ignores "
        f"the key and builds {d.trained!r}: served and trained models differ",
        details,
    )


def _limit(config: Mapping[str, Any], limit: EngineLimit) -> Finding | None:
    value = _value(config, limit.key)
    used = limit.default if value is _ABSENT else value
    if used in limit.allowed:
        return None
    return Finding(
        limit.key,
        Status.FAIL,
        f"{used!r}: {limit.source.engine} refuses to build the drafter ({limit.source.file}: "
        f'"{limit.refusal}"); it accepts {", ".join(map(repr, limit.allowed))}',
        _details(limit.source, limit.key),
    )


def _details(source: EngineSource, key: str) -> dict[str, Any]:
    """A serving finding's details: which engine, the file it was read in, the config key."""
    return {"engine": source.engine, "source": source.file, "key": key}
