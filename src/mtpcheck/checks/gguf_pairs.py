"""Tensors a GGUF file holds in a type that does not keep the HF source's values: a GGML
block type (``Q8_0``) or a narrower float (F16 from BF16, where the converter falls back from
Q8_0 for rows shorter than a block). Each is reported as stored quantized; dequantized
(``diff --dequantize``), it is measured against the source in units of its grid's step there:
``Q8_0`` holds ``d * q`` for 32 elements of a row sharing one F16 scale ``d`` (step ``|d|``),
a float its value (step: the spacing of that type at the value). Rounding to nearest keeps
every value within half a step; other data is many steps off.

Both tensors are streamed in step, a bounded number of elements at a time.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

from mtpcheck.chunks import rechunk
from mtpcheck.dtypes import DTYPES, itemsize
from mtpcheck.model import Checkpoint, TensorComparison, TensorStatus

if TYPE_CHECKING:
    import numpy as np

GGUF_FORMAT = "gguf"
"""The format name of a GGUF file (its reader's); an HF checkpoint shown under GGUF names is
not one."""
_ELEMENTS = 1 << 18
"""Elements dequantized at a time (a multiple of every block size)."""
_FLOAT_STEPS = {"F16": (10, -14), "BF16": (7, -126)}
"""Narrow float -> (mantissa bits, smallest normal exponent)."""


def _label(code: str) -> str:
    return f"GGUF {code}"


def lossy_pairs(
    a: Checkpoint, b: Checkpoint, names: Collection[str]
) -> tuple[list[TensorComparison], set[str]]:
    """The tensors among ``names`` that the GGUF side stores in a type other than the HF
    side's (the view has widened those stored in a type holding each value exactly)."""
    found: list[TensorComparison] = []
    for name in sorted(names):
        ma, mb = a.tensors.get(name), b.tensors.get(name)
        if ma is None or mb is None or ma.dtype == mb.dtype or ma.shape != mb.shape:
            continue
        labels = tuple(
            _label(m.dtype) if c.format == GGUF_FORMAT else m.dtype for c, m in ((a, ma), (b, mb))
        )
        found.append(
            TensorComparison(
                name=name,
                status=TensorStatus.QUANTIZED,
                dtype=(ma.dtype, mb.dtype),
                shape=(ma.shape, mb.shape),
                nbytes=mb.nbytes,
                storage=(labels[0], labels[1]),
            )
        )
    return found, {c.name for c in found}


class NotMeasured(Exception):
    """A GGUF type this module does not dequantize (the reason is the message)."""


def _values(raw: bytes, code: str) -> tuple[np.ndarray, np.ndarray]:
    """Values of ``raw`` (of type ``code``) as float64, with the grid step at each."""
    import numpy as np

    if code == "Q8_0":
        blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("q", "i1", 32)]))
        d = blocks["d"].astype(np.float64)[:, None]
        values = (d * blocks["q"].astype(np.float64)).reshape(-1)
        return values, np.broadcast_to(np.abs(d), blocks["q"].shape).reshape(-1)
    if code in _FLOAT_STEPS:
        mantissa, min_exp = _FLOAT_STEPS[code]
        if code == "F16":
            values = np.frombuffer(raw, dtype="<f2").astype(np.float64)
        else:
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32).astype(np.float64)
        with np.errstate(divide="ignore"):
            exponent = np.floor(np.log2(np.abs(values)))
        exponent = np.where(np.isfinite(exponent), np.maximum(exponent, min_exp), min_exp)
        return values, np.exp2(exponent - mantissa)
    if code in ("F32", "F64"):
        values = np.frombuffer(raw, dtype="<f4" if code == "F32" else "<f8").astype(np.float64)
        return values, np.zeros_like(values)
    raise NotMeasured(f"{_label(code)} is not dequantized by mtpcheck")


def _reference(raw: bytes, code: str) -> np.ndarray:
    import numpy as np

    if code == "BF16":
        bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    if code in ("F16", "F32", "F64"):
        return np.frombuffer(raw, dtype={"F16": "<f2", "F32": "<f4", "F64": "<f8"}[code]).astype(
            np.float64
        )
    raise NotMeasured(f"the full-precision side is {code}")


def _chunks(ckpt: Checkpoint, name: str, size: int) -> Iterator[bytes]:
    return rechunk(ckpt.read_chunks(name, size), size)


def steps_off(full: Checkpoint, stored: Checkpoint, name: str) -> float:
    """The largest distance, in steps of ``stored``'s grid, between ``name`` as ``stored``
    holds it and as ``full`` (the HF side, in full precision) holds it."""
    import numpy as np

    code, ref_code = stored.tensors[name].dtype, full.tensors[name].dtype
    ref_width = itemsize(ref_code)
    per = DTYPES[code].nbytes(_ELEMENTS)
    if ref_width is None or per is None:
        raise NotMeasured(f"{name}: {ref_code} against {_label(code)} is not measured")
    worst = 0.0
    pairs = zip(_chunks(full, name, ref_width * _ELEMENTS), _chunks(stored, name, per), strict=True)
    for ref_raw, stored_raw in pairs:
        reference = _reference(ref_raw, ref_code)
        values, step = _values(stored_raw, code)
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.abs(values - reference) / step
        err = np.where(values == reference, 0.0, err)
        err = np.where(np.isnan(err), np.inf, err)
        worst = max(worst, float(err.max(initial=0.0)))
    return worst
