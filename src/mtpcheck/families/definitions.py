"""What each decoder layer of a family holds as the model's own code builds it, read from the
generated ``definitions.json`` (``scripts/model_definitions.py`` writes it with transformers on
the meta device; reading it needs no torch).

A family's *layer variants* are the distinct sets of parameters its layers hold across the
configs the file was built from (dense and MoE layers, attention kinds, a config's options
such as a low-rank query): a layer of a checkpoint is whole when it holds every parameter of
one variant.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFINITIONS_FILE = Path(__file__).with_name("definitions.json")


@dataclass(frozen=True)
class Definition:
    """A family's layers as its model code builds them."""

    built_by: tuple[str, ...]
    """The classes that built them (transformers' ``DeepseekV3ForCausalLM``)."""
    source: str
    """The library and version, e.g. ``transformers 5.25.0``."""
    layers: tuple[frozenset[str], ...]
    """The layer variants: parameters relative to a layer's prefix, a routed expert's index
    ``*``."""


@functools.lru_cache(maxsize=1)
def _table() -> Mapping[str, object]:
    loaded = json.loads(DEFINITIONS_FILE.read_text())
    assert isinstance(loaded, dict)
    return loaded


def definition_of(family: str) -> Definition | None:
    """The definition of the family with registry key ``family``; None where none was built."""
    table = _table()
    entry = table["families"].get(family)  # type: ignore[attr-defined]
    if entry is None:
        return None
    made = table["produced_by"]
    return Definition(
        tuple(entry["built_by"]),
        f"transformers {made['transformers']}",  # type: ignore[index]
        tuple(frozenset(v) for v in entry["layers"]),
    )


def without_definition() -> Mapping[str, str]:
    """Family key -> why no definition was built for it."""
    found = _table()["without_definition"]
    assert isinstance(found, dict)
    return found
