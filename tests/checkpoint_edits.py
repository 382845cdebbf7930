"""Edits that damage a copy of a shipped checkpoint in place, shared by the tests that build
damaged inputs (the bad-input corpus, the Hub's index damages): each takes the copy's folder and
returns the file it damaged where a test names it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtpcheck.formats.safetensors_header import read_header
from tests.conftest import write_safetensors

SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
"""The two shards of ``fixtures/deepseek_v3``."""
INDEX = "model.safetensors.index.json"


def set_index(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], Path]:
    def edit(root: Path) -> Path:
        index = json.loads((root / INDEX).read_text())
        change(index)
        (root / INDEX).write_text(json.dumps(index))
        return root / INDEX

    return edit


def truncate(rel: str, keep: int) -> Callable[[Path], Path]:
    """Keep the first ``keep`` bytes (negative: drop ``-keep`` bytes from the end)."""

    def edit(root: Path) -> Path:
        path = root / rel
        os.truncate(path, keep if keep >= 0 else path.stat().st_size + keep)
        return path

    return edit


def unlink(rel: str) -> Callable[[Path], Path]:
    def edit(root: Path) -> Path:
        (root / rel).unlink()
        return root / rel

    return edit


def tensor_in_both_shards(root: Path) -> None:
    """Rewrite shard 2 so that it also holds a tensor of shard 1."""
    stolen = "model.embed_tokens.weight"
    tensors = {}
    for shard in (SHARD1, SHARD2):
        header = read_header(str(root / shard))
        with open(root / shard, "rb") as f:
            for name, meta in header.tensors.items():
                if shard == SHARD2 or name == stolen:
                    f.seek(meta.offset)
                    tensors[name] = (meta.dtype, list(meta.shape), f.read(meta.nbytes))
    write_safetensors(root / SHARD2, tensors)
