"""Which drafter kind a checkpoint is (``drafter_kinds``), and what its config says of the
quantities the drafter checks compare: pure functions of a config and tensor names."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from mtpcheck.families.drafter_kinds import (
    DRAFTER_KINDS,
    DSPARK_INSIDE_KEYS,
    LOOKS_LIKE_A_DRAFTER,
    DrafterKind,
)
from mtpcheck.model.config_keys import MISSING, is_int, lookup

_FLAG_SCOPES = ("", "eagle_config.", "speculators_config.", "transformer_layer_config.")
"""Where a drafter format keeps its flags: the top level first."""


def first_at(config: Mapping[str, Any], paths: tuple[str, ...]) -> tuple[str, Any] | None:
    """The first of ``paths`` that holds a value (not None), with that value."""
    for path in paths:
        value = lookup(config, path)
        if value is not MISSING and value is not None:
            return path, value
    return None


def _architectures(config: Mapping[str, Any]) -> tuple[str, ...]:
    found = config.get("architectures")
    return tuple(a for a in found if isinstance(a, str)) if isinstance(found, list) else ()


class _Names:
    """The prefix tests the registry asks of a checkpoint's names, each answered once and at
    C speed (a substring search of the names joined by lines), not by a Python loop over
    every name per kind: DeepSeek-V3 has 92k names, three kinds ask about prefixes."""

    def __init__(self, names: Collection[str]) -> None:
        self.names = names
        self._joined: str | None = None
        self._model: bool | None = None

    def has_prefix(self, prefix: str) -> bool:
        """Whether a name starts with ``prefix``."""
        if self._joined is None:
            joined = "\n" + "\n".join(self.names)
            self._joined = joined if joined.count("\n") == len(self.names) else ""
        if not self._joined or "\n" in prefix:  # a newline in a name: line starts mislead
            return any(n.startswith(prefix) for n in self.names)
        return "\n" + prefix in self._joined

    def holds_a_model(self) -> bool:
        """Whether the tensors are a whole model's (then ``fc.weight`` is some layer's, not a
        drafter's fusion)."""
        if self._model is None:
            self._model = any(
                n.startswith(("model.layers.", "model.language_model.")) for n in self.names
            )
        return self._model


def _matches(kind: DrafterKind, config: Mapping[str, Any], names: _Names) -> bool:
    r = kind.recognition
    speculators = config.get("speculators_model_type")
    if speculators is not None:
        return speculators in r.speculators_types
    if set(_architectures(config)) & set(r.architectures):
        return True
    if config.get("model_type") in r.model_types:
        return True
    if any(lookup(config, key) == value for key, value in r.config_values):
        return True
    return bool(r.tensors) and not names.holds_a_model() and all(map(names.has_prefix, r.tensors))


def recognise(config: Mapping[str, Any], names: Collection[str]) -> DrafterKind | None:
    """The kind of drafter a checkpoint is; None when it is not one this registry knows."""
    tests = _Names(names)
    return next((k for k in DRAFTER_KINDS if _matches(k, config, tests)), None)


def unknown_drafter(config: Mapping[str, Any]) -> str | None:
    """What marks a checkpoint as a drafter of a kind not in the registry, in words; None
    when nothing does."""
    speculators = config.get("speculators_model_type")
    if speculators is not None:
        return f"speculators_model_type {speculators!r}"
    for arch in _architectures(config):
        if any(part in arch for part in LOOKS_LIKE_A_DRAFTER):
            return f"architecture {arch!r}"
    return None


def dspark_inside(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``dspark_*`` keys with which a target says its ``mtp.*`` tensors are a DSpark
    drafter (empty when it says nothing of the kind)."""
    return tuple(k for k in DSPARK_INSIDE_KEYS if k in config)


@dataclass(frozen=True)
class DrafterConfig:
    """What a drafter's config says, read through its kind's paths (None where absent)."""

    vocab: int | None
    hidden: int | None
    target_hidden: int | None
    """The target's width the drafter was built for (its own width when not said)."""
    draft_vocab: int | None
    taps: Any
    """The auxiliary layer ids as written (None when no key holds them)."""
    taps_key: str | None
    positions: int | None
    rope: Any
    layers: int | None
    layer_types: tuple[str, ...]
    flags: Mapping[str, Any]
    """Each of the kind's flags that the config sets, with its value."""
    verifier: Mapping[str, Any] | None


def _int_at(config: Mapping[str, Any], paths: tuple[str, ...]) -> int | None:
    found = first_at(config, paths)
    value = None if found is None else found[1]
    return value if is_int(value) else None


def _flags(kind: DrafterKind, config: Mapping[str, Any]) -> dict[str, Any]:
    found = {}
    for flag in kind.flags:
        hit = first_at(config, tuple(scope + flag.key for scope in _FLAG_SCOPES))
        if hit is not None:
            found[flag.key] = hit[1]
    return found


def read_config(kind: DrafterKind, config: Mapping[str, Any]) -> DrafterConfig:
    """The quantities of ``config`` the drafter checks compare."""
    p = kind.paths
    hidden = _int_at(config, p.hidden)
    taps = first_at(config, p.taps)
    rope = first_at(config, p.rope)
    types = first_at(config, p.layer_types)
    verifier = lookup(config, "speculators_config.verifier")
    return DrafterConfig(
        vocab=_int_at(config, p.vocab),
        hidden=hidden,
        target_hidden=_int_at(config, p.target_hidden) or hidden,
        draft_vocab=_int_at(config, p.draft_vocab),
        taps=None if taps is None else taps[1],
        taps_key=None if taps is None else taps[0],
        positions=_int_at(config, p.positions),
        rope=None if rope is None else rope[1],
        layers=_int_at(config, p.layers),
        layer_types=tuple(map(str, types[1])) if types and isinstance(types[1], list) else (),
        flags=_flags(kind, config),
        verifier=verifier if isinstance(verifier, Mapping) else None,
    )


def vllm_speculative_config(method: str, model: str, tokens: int | None) -> dict[str, Any]:
    """vLLM's ``speculative_config`` drafting with the drafter at ``model`` by ``method``;
    ``num_speculative_tokens`` only where ``tokens`` is known."""
    spec: dict[str, Any] = {"method": method, "model": model}
    if tokens is not None:
        spec["num_speculative_tokens"] = tokens
    return spec


def flag_on(value: Any) -> bool:
    """Whether a flag's value turns its tensor on (``true``, or an id such as a mask token)."""
    return value is not None and value is not False


def draft_tokens(config: Mapping[str, Any]) -> int | None:
    """The draft length speculators recorded: ``speculative_tokens`` of its default proposal
    method (the first where none is named default); None where it records none."""
    spec = config.get("speculators_config")
    methods = spec.get("proposal_methods") if isinstance(spec, Mapping) else None
    if not isinstance(methods, list):
        return None
    usable = [m for m in methods if isinstance(m, Mapping)]
    default = spec.get("default_proposal_method") if isinstance(spec, Mapping) else None
    chosen = [m for m in usable if m.get("proposal_type") == default] or usable
    tokens = chosen[0].get("speculative_tokens") if chosen else None
    return tokens if is_int(tokens) and tokens > 0 else None
