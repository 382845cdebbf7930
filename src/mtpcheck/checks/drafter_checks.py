"""Checks of a drafter that ships beside its target, against its own config: its kind, the
tensors its config implies, the fusion width, its taps and its vocabulary maps.

The pairing with a target is checked in :mod:`~mtpcheck.checks.drafter_pairing`; how to serve
the pair is said by :mod:`~mtpcheck.checks.drafter_serving`.
"""

from __future__ import annotations

from collections.abc import Mapping

from mtpcheck.families.drafter_kinds import DEFAULT_TAPS, DrafterKind, Taps
from mtpcheck.families.drafters import DrafterConfig, flag_on
from mtpcheck.families.name_templates import NameTemplate
from mtpcheck.model import CheckName, CheckResult, Finding, Status, TensorMeta
from mtpcheck.model.config_keys import is_int
from mtpcheck.units import first_few

_KIND_TITLE = "Drafter kind"
_TAPS_TITLE = "Auxiliary layer ids"


def kind_check(kind: DrafterKind, cfg: DrafterConfig) -> CheckResult:
    """Which kind of drafter this is, and what mtpcheck checks of it."""
    widths = f"width {cfg.hidden}" if cfg.hidden else "width not in its config"
    message = f"{kind.display}: {widths}; checked: {kind.checked}"
    if kind.not_checked:
        message += f"; not checked: {kind.not_checked}"
    return CheckResult(
        CheckName.DRAFTER_KIND, _KIND_TITLE, (Finding(kind.key, Status.PASS, message),)
    )


def unknown_kind_check(seen: str) -> CheckResult:
    """A drafter of a kind not in the registry: nothing of it can be judged."""
    message = (
        f"a drafter ({seen}) of a kind mtpcheck does not know: its tensors are not checked "
        "against its config"
    )
    return CheckResult(
        CheckName.DRAFTER_KIND, _KIND_TITLE, (Finding("kind", Status.SKIP, message),)
    )


def _prefix_present(names: Mapping[str, TensorMeta], wanted: str) -> bool:
    if wanted.endswith("."):
        return any(n.startswith(wanted) for n in names)
    return wanted in names


def _flag_findings(
    kind: DrafterKind, cfg: DrafterConfig, tensors: Mapping[str, TensorMeta]
) -> list[Finding]:
    found = []
    taps = len(cfg.taps) if isinstance(cfg.taps, list) else 0
    for flag in kind.flags:
        on = flag_on(cfg.flags.get(flag.key))
        tensor = NameTemplate(flag.tensor)
        wanted = [tensor.fill(i) for i in range(taps)] if tensor.holds("i") else [flag.tensor]
        held = [n for n in wanted if n in tensors]
        if on and len(held) < len(wanted):
            lost = [n for n in wanted if n not in tensors]
            found.append(
                Finding(
                    flag.key,
                    Status.FAIL,
                    f"{flag.key} is set but {first_few(lost, 3)} is absent: {flag.engine_note}",
                )
            )
        elif not on and held:
            found.append(
                Finding(
                    flag.key,
                    Status.FAIL,
                    f"{first_few(held, 3)} is stored but {flag.key} is not set, so engines "
                    f"never apply it: {flag.engine_note}",
                )
            )
        elif on:
            found.append(Finding(flag.key, Status.PASS, f"set, with {first_few(held, 3)}"))
    return found


def _fc_width(
    kind: DrafterKind, cfg: DrafterConfig, tensors: Mapping[str, TensorMeta]
) -> Finding | None:
    """``fc.weight`` fuses one target hidden state per tap."""
    fc = tensors.get("fc.weight")
    if not kind.fc_width_taps or fc is None or len(fc.shape) != 2 or not cfg.target_hidden:
        return None
    if not isinstance(cfg.taps, list):
        return None  # the taps check fails it
    want = len(cfg.taps) * cfg.target_hidden
    if fc.shape[1] == want:
        return Finding(
            "fc.weight",
            Status.PASS,
            f"input width {want} = {len(cfg.taps)} taps x target width {cfg.target_hidden}",
        )
    return Finding(
        "fc.weight",
        Status.FAIL,
        f"input width {fc.shape[1]}, but {len(cfg.taps)} taps x target width "
        f"{cfg.target_hidden} is {want}: the fusion does not fit the taps its config names",
    )


def _widths(
    kind: DrafterKind, cfg: DrafterConfig, tensors: Mapping[str, TensorMeta]
) -> list[Finding]:
    found = []
    for w in kind.widths:
        meta, base = tensors.get(w.tensor), getattr(cfg, w.of)
        if meta is None or len(meta.shape) <= w.dim or not base:
            continue
        want, got = w.times * base, meta.shape[w.dim]
        said = (
            f"{w.times} x {w.of.replace('_', ' ')} {base}"
            if w.times > 1
            else f"{w.of.replace('_', ' ')} {base}"
        )
        if got == want:
            found.append(Finding(w.tensor, Status.PASS, f"dimension {w.dim} = {said} ({w.what})"))
        else:
            found.append(
                Finding(
                    w.tensor,
                    Status.FAIL,
                    f"dimension {w.dim} is {got}, not {said} = {want} ({w.what})",
                )
            )
    return found


def _divides(kind: DrafterKind, cfg: DrafterConfig, config: Mapping[str, object]) -> list[Finding]:
    found = []
    for key, quantity in kind.divides:
        value, total = config.get(key), getattr(cfg, quantity)
        if not is_int(value) or value <= 0 or not total:
            continue
        status = Status.PASS if total % value == 0 else Status.FAIL
        verb = "divides" if status is Status.PASS else "does not divide"
        found.append(Finding(key, status, f"{value} {verb} the vocabulary {total}"))
    return found


def tensors_check(
    kind: DrafterKind,
    cfg: DrafterConfig,
    tensors: Mapping[str, TensorMeta],
    config: Mapping[str, object],
) -> CheckResult:
    """Every tensor the kind and the config's flags imply is there, and fc fits the taps."""
    lost = [n for n in kind.required if not _prefix_present(tensors, n)]
    findings = [
        Finding(n.rstrip("."), Status.FAIL, "absent: every drafter of this kind holds it")
        for n in lost
    ]
    if kind.required and not lost:
        shown = first_few([n.rstrip(".") for n in kind.required], 6)
        findings.append(Finding("tensors", Status.PASS, f"the kind's tensors are there: {shown}"))
    findings += _flag_findings(kind, cfg, tensors)
    width = _fc_width(kind, cfg, tensors)
    if width is not None:
        findings.append(width)
    findings += _widths(kind, cfg, tensors) + _divides(kind, cfg, config)
    if not findings:
        findings.append(Finding("tensors", Status.SKIP, "nothing of this kind is checked"))
    return CheckResult(
        CheckName.DRAFTER_TENSORS, "Drafter tensors against its config", tuple(findings)
    )


def _defaults(layers: int | None) -> str:
    guess = f"({2}, {layers // 2}, {layers - 3})" if layers else "(2, n // 2, n - 3)"
    where = f" of the target's {layers} layers" if layers else " of the target's n layers"
    readers = f"{', '.join(DEFAULT_TAPS[:-1])} and {DEFAULT_TAPS[-1]}"
    return f"{readers} each use {guess}{where}"


def _tap_range(taps: Taps, layers: int) -> tuple[int, int, str]:
    if taps is Taps.HIDDEN_STATE:
        return 0, layers, "hidden-state indices: 0 the embedding, k the output of layer k - 1"
    return -1, layers - 1, "layer outputs: k the output of 0-based layer k"


def taps_check(
    kind: DrafterKind, cfg: DrafterConfig, target_layers: int | None = None
) -> CheckResult | None:
    """The auxiliary layer ids: present, increasing, and (with the target's layer count)
    inside the target; None for a kind without taps."""
    if kind.taps is Taps.NONE:
        return None
    key = kind.paths.taps[0]
    if cfg.taps is None:
        f = Finding(
            key,
            Status.FAIL,
            f"absent: no engine is told which target layers to tap, and each guesses "
            f"({_defaults(target_layers)}); unless the drafter was trained on exactly those, "
            "acceptance collapses with nothing in the logs",
        )
        return CheckResult(CheckName.DRAFTER_TAPS, _TAPS_TITLE, (f,))
    ids = cfg.taps
    if not isinstance(ids, list) or not all(type(i) is int for i in ids) or not ids:
        f = Finding(cfg.taps_key or key, Status.FAIL, f"not a list of layer ids: {ids!r}")
        return CheckResult(CheckName.DRAFTER_TAPS, _TAPS_TITLE, (f,))
    findings = []
    if any(b <= a for a, b in zip(ids, ids[1:], strict=False)):
        findings.append(Finding(cfg.taps_key or key, Status.FAIL, f"{ids} not increasing"))
    if target_layers:
        low, high, how = _tap_range(kind.taps, target_layers)
        outside = [i for i in ids if not low <= i <= high]
        if outside:
            findings.append(
                Finding(
                    cfg.taps_key or key,
                    Status.FAIL,
                    f"{outside} outside the target's {target_layers} layers (read as {how}: "
                    f"{low}..{high})",
                )
            )
    if not findings:
        where = f" inside the target's {target_layers} layers" if target_layers else ""
        findings.append(
            Finding(
                cfg.taps_key or key,
                Status.PASS,
                f"{ids}, increasing{where}, in the {kind.taps.value} numbering",
            )
        )
    findings += [Finding(reader, Status.INFO, how) for reader, how in kind.taps_read]
    if not target_layers:
        findings.append(
            Finding("target", Status.SKIP, "whether they lie inside the target: needs --target")
        )
    return CheckResult(CheckName.DRAFTER_TAPS, _TAPS_TITLE, tuple(findings))
