"""Where a model config keeps a key.

A causal LM's ``config.json`` states its keys at the top level; a vision-language model
nests the language model's under ``text_config`` (Qwen3.5, Kimi-VL: what transformers'
``get_text_config()`` returns), and the MTP count, width and layer count are then there.
Every lookup of such a key goes through :func:`text_value`, the top level first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final, TypeGuard

TEXT_CONFIG: Final = "text_config"
TEXT_ROOTS: Final = ("", f"{TEXT_CONFIG}.")
"""Prefixes of a key's dotted paths, in the order they are looked at."""

MISSING: Final = object()
"""What :func:`lookup` returns for a path the config does not hold (null is a value)."""


def lookup(config: Mapping[str, Any], dotted: str) -> Any:
    """The value at a dotted key path, or :data:`MISSING`."""
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def text_value(
    config: Mapping[str, Any], key: str, accept: Callable[[Any], bool] = lambda _: True
) -> tuple[str, Any] | None:
    """(dotted path, value) of the first of ``key`` and ``text_config.key`` the config holds
    with a value ``accept`` takes; None when neither does."""
    for root in TEXT_ROOTS:
        value = lookup(config, root + key)
        if value is not MISSING and accept(value):
            return root + key, value
    return None


def is_int(value: Any) -> TypeGuard[int]:
    """An integer in JSON's sense (``True`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)
