"""Key-by-key comparison of two model configs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from mtpcheck.families.catalog import FAMILIES, GENERIC_COUNT_KEYS
from mtpcheck.model import CheckName, CheckResult, Finding, Status
from mtpcheck.model.config_keys import TEXT_ROOTS

_STRUCTURAL = (
    "num_hidden_layers",
    "hidden_size",
    "vocab_size",
    "model_type",
    "architectures",
    "tie_word_embeddings",
)
MTP_COUNT_KEYS = tuple(
    sorted({k for f in FAMILIES for k in f.count.keys} | set(GENERIC_COUNT_KEYS))
)

HIGHLIGHTED = frozenset(
    prefix + key for key in (*MTP_COUNT_KEYS, *_STRUCTURAL) for prefix in TEXT_ROOTS
)
"""Keys whose change fails the diff: the MTP count and what locates or shapes MTP tensors."""

NAME = CheckName.CONFIG
TITLE = "Config keys"

_ABSENT = object()


def flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Yield (dotted key, value) for every leaf; lists are leaves."""
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flatten(value, path + ".")
        else:
            yield path, value


def _show(value: Any) -> str:
    return "(absent)" if value is _ABSENT else repr(value)


def config_check(
    a: Mapping[str, Any], b: Mapping[str, Any], a_has: bool, b_has: bool
) -> CheckResult:
    """Highlighted keys that changed FAIL; every other changed key is listed as INFO."""
    if not (a_has and b_has):
        which = "either side" if not (a_has or b_has) else ("A" if not a_has else "B")
        status = Status.SKIP if not (a_has or b_has) else Status.FAIL
        finding = Finding("config.json", status, f"no config.json on {which}")
        return CheckResult(NAME, TITLE, (finding,))
    fa = dict(flatten(a))
    fb = dict(flatten(b))
    findings = []
    for key in sorted(fa.keys() | fb.keys()):
        va = fa.get(key, _ABSENT)
        vb = fb.get(key, _ABSENT)
        if va == vb and type(va) is type(vb):
            continue
        status = Status.FAIL if key in HIGHLIGHTED else Status.INFO
        findings.append(Finding(key, status, f"{_show(va)} -> {_show(vb)}"))
    if not any(f.status is Status.FAIL for f in findings):
        changed = len(findings)
        findings.insert(
            0,
            Finding(
                "mtp keys",
                Status.PASS,
                "MTP count and structural keys unchanged"
                + (f"; {changed} other key(s) changed" if changed else ""),
            ),
        )
    return CheckResult(NAME, TITLE, tuple(findings))
