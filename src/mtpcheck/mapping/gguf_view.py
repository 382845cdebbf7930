"""An HF checkpoint shown as the GGUF file llama.cpp's converter writes from it.

``as_gguf(hf, gguf)`` names every tensor a rule of :mod:`mtpcheck.mapping.gguf_names` covers
as llama.cpp names it, stacks per-expert matrices as it stacks them and adds one to the norms
it adds one to, so the tensor matcher compares the two byte for byte. Where the GGUF file
holds a tensor in a float type that holds the source's values exactly (F32 for a BF16
source: llama.cpp keeps every 1-D tensor and the router in F32), the view widens the source
to that type, exactly, bit for bit; any other type (Q8_0, F16 from BF16) is left to
:mod:`mtpcheck.checks.gguf_pairs`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mtpcheck.chunks import rechunk
from mtpcheck.dtypes import exact_wider, itemsize
from mtpcheck.errors import InputError
from mtpcheck.families import analyse
from mtpcheck.mapping import transforms as tf
from mtpcheck.mapping.gguf_names import (
    CONVERTER,
    GgufPlan,
    GgufTarget,
    arch_for,
    mapped_arches,
    plan_gguf,
)
from mtpcheck.model import Checkpoint, Naming, TensorMeta, ViewData

_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_ELEMENTS = 1 << 20
"""Elements converted at a time."""


@dataclass(frozen=True)
class GgufView(ViewData):
    """An HF checkpoint under llama.cpp's names and layout."""

    plan: GgufPlan
    source_dtypes: Mapping[str, str] = field(default_factory=dict)
    """Name here -> the dtype of the HF tensors it is computed from."""
    naming: Naming = Naming.GGUF

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        """The tensor's bytes under llama.cpp's layout: the source's bytes in turn, widened and
        plus one where llama.cpp stores them so."""
        target = self.plan.targets[name]
        have, want = self.source_dtypes[name], self.tensors[name].dtype
        if have == want and not target.plus_one:
            parts = (c for h in target.sources for c in self.source.read_chunks(h, chunk_bytes))
            return rechunk(parts, chunk_bytes)
        return rechunk(self._converted(target, have, want), chunk_bytes)

    def _converted(self, target: GgufTarget, have: str, want: str) -> Iterator[bytes]:
        width = itemsize(have)
        assert width is not None
        for source in target.sources:
            size = width * _ELEMENTS
            for chunk in rechunk(self.source.read_chunks(source, size), size):
                bits = np.frombuffer(chunk, dtype=_UINT[width])
                if have != want:
                    bits = tf.widen(bits, have, want)
                if target.plus_one:
                    bits = tf.add_to_values(bits, want, 1.0)
                yield bits.tobytes()


def _hidden_layers(hf: Checkpoint) -> tuple[int, int | None]:
    analysis = analyse(hf.config, hf.tensors, hf.config_path)
    if analysis.num_hidden_layers is None:
        raise InputError(hf.path, "its config gives no num_hidden_layers to place llama.cpp blocks")
    declared = analysis.declared.value
    if declared is None and analysis.layers:
        declared = len(analysis.layers)
    return analysis.num_hidden_layers, declared


def _dtype(target: GgufTarget, source: str, gguf: Checkpoint) -> str:
    """The type the view gives ``target``: the GGUF file's where it holds the source's values
    exactly (or the plus-one sum, computed in F32), the source's otherwise."""
    stored = gguf.tensors.get(target.name)
    if target.plus_one:
        return "F32"
    if stored is not None and stored.dtype in exact_wider(source):
        return stored.dtype
    return source


def as_gguf(hf: Checkpoint, gguf: Checkpoint) -> GgufView:
    """Show ``hf`` as the GGUF file of ``gguf``'s architecture its converter would write."""
    arch = arch_for(gguf.config)
    if arch is None:
        raise InputError(
            gguf.path,
            f"llama.cpp architecture {gguf.config.get('architecture')!r} has no HF name "
            f"mapping in mtpcheck (mapped: {mapped_arches()})",
        )
    architectures = hf.config.get("architectures") or []
    if architectures and not set(architectures) & set(arch.hf_architectures):
        raise InputError(
            hf.path,
            f"is a {', '.join(architectures)} checkpoint; {gguf.path} is llama.cpp's "
            f"{arch.arch}, converted from {', '.join(arch.hf_architectures)}",
        )
    hidden, declared = _hidden_layers(hf)
    plan = plan_gguf(arch, hf.tensors, hidden)
    tensors: dict[str, TensorMeta] = {}
    source_dtypes: dict[str, str] = {}
    for name, target in plan.targets.items():
        metas = [hf.tensors[s] for s in target.sources]
        if len({(m.dtype, m.shape) for m in metas}) != 1:
            continue  # experts of different forms: the converter could not stack them
        first = metas[0]
        dtype = _dtype(target, first.dtype, gguf)
        width, source_width = itemsize(dtype), itemsize(first.dtype)
        if width is None or source_width is None:
            continue
        shape = (len(metas), *first.shape) if len(metas) > 1 else first.shape
        nbytes = sum(m.nbytes for m in metas) // source_width * width
        readable = all(m.readable for m in metas)
        tensors[name] = TensorMeta(name, dtype, shape, first.file, 0, nbytes, readable)
        source_dtypes[name] = first.dtype
    config: dict[str, Any] = {
        "model_type": "gguf",
        "architecture": arch.arch,
        "num_hidden_layers": hidden,
        "block_count": hidden + (declared or 0),
        "converter": CONVERTER,
    }
    if declared is not None:
        config["nextn_predict_layers"] = declared
    return GgufView.over(hf, "gguf", config, tensors, plan=plan, source_dtypes=source_dtypes)
