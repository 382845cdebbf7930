"""The published ``config.json`` files of MTP models shipped with mtpcheck (``published/``,
each with its source in ``published/SOURCES.md``): what ``mtpcheck.testing.tiny_checkpoint``
scales down, and what the tests hold the layer layouts and the synthetic round trip to.

A file is named ``MODEL_TYPE__RELEASE.json`` (``glm_moe_dsa__GLM-5.json``).
"""

from __future__ import annotations

from pathlib import Path

PUBLISHED_DIR = Path(__file__).resolve().with_name("published")
"""Where the files are, inside the installed package."""


def published_configs() -> tuple[Path, ...]:
    """Every shipped config, sorted by file name."""
    return tuple(sorted(PUBLISHED_DIR.glob("*.json")))


def published_config(name: str) -> Path:
    """The config of a release (``GLM-5``, ``DeepSeek-V3.2``) or, for a ``model_type``
    (``glm_moe_dsa``), its first release by file name; :class:`KeyError` naming the model
    types there are for any other name."""
    configs = published_configs()
    releases = [p for p in configs if p.stem.partition("__")[2] == name]
    of_type = [p for p in configs if p.stem.partition("__")[0] == name]
    for found in (releases, of_type):
        if found:
            return found[0]
    known = sorted({p.stem.partition("__")[0] for p in configs})
    raise KeyError(f"no published config for {name!r}; model types: {', '.join(known)}")
