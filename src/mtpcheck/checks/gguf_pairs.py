"""Tensors a GGUF file holds in a type that does not keep the HF source's values: a GGML
block type (``Q8_0``, ``Q4_K``, ``Q6_K``) or a narrower float (F16 from BF16, where the
converter falls back from Q8_0 for rows shorter than a block). Each is reported as stored
quantized; dequantized (``diff --dequantize``), it is measured against the source in units of
its grid's step there: ``Q8_0`` holds ``d * q`` for 32 elements of a row sharing one F16 scale
``d`` (step ``|d|``), ``Q4_K`` ``d * sc * q - dmin * m`` per sub-block of 32 and ``Q6_K``
``d * sc * q`` per 16 (step ``d * sc``), a float its value (step: the spacing of that type at
the value). A block's scales reach a range of values (its extreme codes); a source value
beyond it is stored as the nearest end, so it is measured from there (llama.cpp's K-quant
scales are searched to fit most of a block, not every value). Rounding to nearest keeps every
value within half a step; other data is many steps off."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, NamedTuple

from mtpcheck.chunks import rechunk
from mtpcheck.dtypes import DTYPES, float_layout, is_high_precision, itemsize
from mtpcheck.model import Checkpoint, TensorComparison, TensorStatus

if TYPE_CHECKING:
    import numpy as np

GGUF_FORMAT = "gguf"
"""The format name of a GGUF file (its reader's); an HF checkpoint shown under GGUF names is
not one."""
_ELEMENTS = 1 << 18
"""Elements dequantized at a time (a multiple of every block size)."""
_EXACT_BITS = 32
"""A GGUF float this wide holds the source's values (its step: none)."""


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


class _Grid(NamedTuple):
    """Decoded values with, at each, the step of its grid and the range its block's scales can
    represent (the extreme codes' values)."""

    values: np.ndarray
    step: np.ndarray
    low: np.ndarray
    high: np.ndarray


def _grid(
    values: np.ndarray, step: np.ndarray, ends: tuple[np.ndarray | float, np.ndarray | float]
) -> _Grid:
    import numpy as np

    shape = values.shape
    a, b = (np.broadcast_to(e, shape) for e in ends)
    return _Grid(values, np.abs(np.broadcast_to(step, shape)), np.minimum(a, b), np.maximum(a, b))


def _q8_0(raw: bytes) -> _Grid:
    """``block_q8_0``: F16 ``d``, 32 int8 ``q``; value ``d * q``."""
    import numpy as np

    b = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("q", "i1", 32)]))
    d = b["d"].astype(np.float64)[:, None]
    return _grid(d * b["q"], d, (-128 * d, 127 * d))


def _q4_k(raw: bytes) -> _Grid:
    """``block_q4_K``: 256 elements in 8 sub-blocks of 32, each ``d * sc * q - dmin * m`` with
    6-bit ``sc`` and ``m`` packed in 12 bytes, 4-bit ``q`` (a 32-byte chunk holds two
    sub-blocks: low nibbles, then high)."""
    import numpy as np

    layout = [("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", 12), ("qs", "u1", 128)]
    b = np.frombuffer(raw, dtype=np.dtype(layout))
    q = b["scales"].astype(np.int64)
    sc = np.concatenate([q[:, 0:4] & 63, (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)], axis=1)
    mn = np.concatenate([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], axis=1)
    step = (b["d"].astype(np.float64)[:, None] * sc)[:, :, None]
    low = (b["dmin"].astype(np.float64)[:, None] * mn)[:, :, None]
    qs = b["qs"].reshape(-1, 4, 1, 32)
    nibbles = np.concatenate([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32)
    grid = _grid(step * nibbles - low, step, (-low, 15 * step - low))
    return _Grid(*(a.reshape(len(b), -1) for a in grid))


def _q6_k(raw: bytes) -> _Grid:
    """``block_q6_K``: 256 elements, ``d * sc * (q - 32)`` with an int8 ``sc`` per 16 and 6-bit
    ``q`` split in low nibbles (``ql``) and 2-bit high parts (``qh``), 128 elements a half."""
    import numpy as np

    layout = [("ql", "u1", 128), ("qh", "u1", 64), ("scales", "i1", 16), ("d", "<f2")]
    b = np.frombuffer(raw, dtype=np.dtype(layout))
    ql = b["ql"].reshape(-1, 2, 2, 32).astype(np.int64)  # half, first/second 32 bytes
    qh = b["qh"].reshape(-1, 2, 1, 32).astype(np.int64)
    low = np.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], 2)
    high = (qh >> np.array([0, 2, 4, 6]).reshape(1, 1, 4, 1)) & 3
    q = (low | (high << 4)) - 32  # [block, half, quarter, 32]
    sc = b["scales"].reshape(-1, 2, 4, 2).astype(np.float64)  # a scale per 16 elements
    scale = np.repeat(sc, 16, axis=3) * b["d"].astype(np.float64)[:, None, None, None]
    grid = _grid(scale * q, scale, (-32 * scale, 31 * scale))
    return _Grid(*(a.reshape(len(b), -1) for a in grid))


_BLOCKS = {"Q8_0": _q8_0, "Q4_K": _q4_k, "Q6_K": _q6_k}
"""GGML block types decoded here, as ``ggml-quants.c`` dequantizes them."""


def _values(raw: bytes, code: str) -> _Grid:
    """Values of ``raw`` (of type ``code``) as float64, with the grid step and range at each
    (a float's range: unbounded)."""
    import numpy as np

    if code in _BLOCKS:
        return _Grid(*(a.reshape(-1) for a in _BLOCKS[code](raw)))
    layout = float_layout(code)
    if layout is None or not is_high_precision(code):
        raise NotMeasured(f"{_label(code)} is not dequantized by mtpcheck")
    values = _reference(raw, code)
    if DTYPES[code].bits >= _EXACT_BITS:
        return _grid(values, np.zeros_like(values), (-np.inf, np.inf))
    # a narrow float's step: its spacing at the value (subnormals: the smallest normal's)
    mantissa, min_exp = layout.mantissa_bits, layout.min_exponent
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(np.abs(values)))
    exponent = np.where(np.isfinite(exponent), np.maximum(exponent, min_exp), min_exp)
    return _grid(values, np.exp2(exponent - mantissa), (-np.inf, np.inf))


def _reference(raw: bytes, code: str) -> np.ndarray:
    """A float tensor's values as float64 (each exactly)."""
    import numpy as np

    from mtpcheck.mapping.transforms import decode

    if not is_high_precision(code):
        raise NotMeasured(f"the full-precision side is {code}")
    return decode(np.frombuffer(raw, dtype=f"<u{DTYPES[code].bits // 8}"), code)


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
        values, step, low, high = _values(stored_raw, code)
        # a source value beyond what its block's scales reach is stored as the nearest end
        # (the K-quants' scales are chosen to fit most values, not all); a block of no width
        # (every scale zero) reaches nothing
        reference = np.where(step > 0, np.clip(reference, low, high), reference)
        with np.errstate(divide="ignore", invalid="ignore"):
            err = np.abs(values - reference) / step
        err = np.where(values == reference, 0.0, err)
        err = np.where(np.isnan(err), np.inf, err)
        worst = max(worst, float(err.max(initial=0.0)))
    return worst
