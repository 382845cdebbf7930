"""The quantization scheme a checkpoint declares: its ``quantization_config`` (config.json)
or NVIDIA modelopt's ``hf_quant_config.json``, read into one record."""

from __future__ import annotations

import enum
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtpcheck.model import Checkpoint, DeclaresQuantization
from mtpcheck.model.config_keys import text_value
from mtpcheck.params.parts import Method

_METHODS = {m.value: m for m in Method if m not in (Method.NONE, Method.OTHER)}


class Rounding(str, enum.Enum):
    """How the quantizer chose each stored value, which decides whether ``diff --dequantize``
    can judge a value by its distance in steps from the original."""

    NEAREST = "nearest"
    """Rounded to the nearest point of its grid (RTN, AutoRound, bitsandbytes, mlx-lm,
    llm-compressor's data-free schemes, FP8): within half a step, past rounding of its
    scales; judged."""
    ERROR_FEEDBACK = "error-feedback"
    """GPTQ: each column's rounding error is pushed into the columns after it, so a value may
    lie several steps from its original (GPTQModel, AutoGPTQ): measured, not judged."""
    ACTIVATION_SCALED = "activation-scaled"
    """AutoAWQ: each input column is scaled by its activations before quantizing and the
    inverse folded into the layer before, so the stored matrix is not the original's:
    measured, not judged."""

    @property
    def unjudged_because(self) -> str:
        """Why values rounded this way are not judged by their distance in steps ("" for
        :attr:`NEAREST`, which is)."""
        return _UNJUDGED.get(self, "")


_UNJUDGED = {
    Rounding.ERROR_FEEDBACK: "GPTQ moves each value to make up for the rounding of the columns "
    "before it",
    Rounding.ACTIVATION_SCALED: "AWQ stores each input column scaled by its activations",
}


@dataclass(frozen=True)
class Scheme:
    """How a checkpoint says its weights are quantized."""

    method: Method
    declared: str
    """The ``quant_method`` as written (``""`` when none is declared)."""
    formats: tuple[str, ...] = ()
    """Storage formats named (compressed-tensors ``format``, modelopt ``quant_algo``)."""
    block_size: tuple[int, ...] | None = None
    """FP8 block releases: the ``weight_block_size`` one scale covers."""
    ignore: tuple[str, ...] = ()
    """Modules left unquantized, as the format spells them (names, ``re:`` patterns, globs
    or substrings: see :meth:`ignoring_entry`)."""
    weight_bits: int | None = None
    """Bits of a quantized weight element, where the config says (``num_bits``, ``bits``)."""
    group_size: int | None = None
    rounding: Rounding = Rounding.NEAREST

    def ignoring_entry(self, module: str) -> str | None:
        """The ignore entry that leaves ``module`` (a module path, no ``.weight``) unquantized,
        if any, by the matching rule of the tool that reads the list: compressed-tensors takes a
        name or an ``re:`` pattern matched at the start, modelopt shell globs, transformers'
        ``modules_to_not_convert`` (FP8, AWQ, GPTQ) any name part."""
        return next((e for e in self.ignore if self._matches(e, module)), None)

    def _matches(self, entry: str, module: str) -> bool:
        if self.method is Method.COMPRESSED_TENSORS:
            return _match(entry[3:], module) if entry.startswith("re:") else entry == module
        if self.method is Method.MODELOPT:
            return fnmatch.fnmatchcase(module, entry)
        return bool(entry) and entry in module


NONE = Scheme(Method.NONE, "")


def _match(pattern: str, name: str) -> bool:
    try:
        return re.match(pattern, name) is not None
    except re.error:
        return False  # a pattern its own tool could not compile either


def _strings(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str))
    return ()


def _first_int(values: list[Any]) -> int | None:
    return next((v for v in values if type(v) is int and v > 0), None)


def _ints(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and value and all(type(v) is int for v in value):
        return tuple(value)
    return None


_ALIASES = {"intel/auto-round": Method.AUTO_ROUND}
"""Other spellings of a ``quant_method`` (AutoRound's older exports)."""
_VARIANT_KEYS = (
    "format",
    "quant_algo",
    "bnb_4bit_quant_type",
    "checkpoint_format",
    "packing_format",
)
"""Keys that name a storage variant of a method: compressed-tensors ``format``, modelopt
``quant_algo``, bitsandbytes NF4 / FP4 (read with ``load_in_4bit`` only: an 8-bit config keeps
the 4-bit default), GPTQ v1 / v2, AutoRound's packing. AWQ's ``version``
(GEMM / GEMV) is read for AWQ only: compressed-tensors writes its own release there."""


def scheme_of(
    config: Mapping[str, Any], hf_quant_config: Mapping[str, Any] | None = None
) -> Scheme:
    """The scheme ``config`` (or, failing that, modelopt's ``hf_quant_config``) declares;
    :data:`NONE` when neither declares one. Malformed entries are read as absent: the scheme
    describes a checkpoint, it does not validate its config."""
    found = text_value(config, "quantization_config", lambda v: isinstance(v, Mapping))
    mlx = config.get("quantization")
    if isinstance(mlx, Mapping) and (found is None or "quant_method" not in found[1]):
        return _mlx_scheme(mlx)
    if found is not None:
        return _declared(found[1])
    if isinstance(hf_quant_config, Mapping):
        return _modelopt_scheme(hf_quant_config)
    return NONE


def _declared(q: Mapping[str, Any]) -> Scheme:
    """A ``quantization_config`` with a ``quant_method`` (or without one: OTHER)."""
    declared = q.get("quant_method")
    declared = declared if isinstance(declared, str) else ""
    method = _METHODS.get(declared.lower()) or _ALIASES.get(declared.lower(), Method.OTHER)
    formats = tuple(
        f
        for key in _VARIANT_KEYS
        if key != "bnb_4bit_quant_type" or q.get("load_in_4bit") is True
        for f in _strings(q.get(key))
    )
    groups = q.get("config_groups")
    groups = (
        [g for g in groups.values() if isinstance(g, Mapping)]
        if isinstance(groups, Mapping)
        else []
    )
    if not formats:
        formats = tuple(sorted({f for g in groups for f in _strings(g.get("format"))}))
    if method is Method.AWQ:
        formats += _strings(q.get("version"))
    if q.get("load_in_8bit") is True:
        formats += ("llm.int8",)
    weights = [g["weights"] for g in groups if isinstance(g.get("weights"), Mapping)]
    bits = _first_int(
        [w.get("num_bits") for w in weights] + [q.get("bits"), q.get("w_bit"), _bnb_bits(q)]
    )
    group = _first_int(
        [w.get("group_size") for w in weights] + [q.get("group_size"), q.get("q_group_size")]
    )
    ignore = tuple(
        entry
        for key in ("ignore", "modules_to_not_convert", "exclude_modules", "llm_int8_skip_modules")
        for entry in _strings(q.get(key))
    )
    block = _ints(q.get("weight_block_size")) or next(
        (b for w in weights if (b := _ints(w.get("block_structure")))), None
    )
    return Scheme(method, declared, formats, block, ignore, bits, group, _rounding(method, q))


def _rounding(method: Method, q: Mapping[str, Any]) -> Rounding:
    """GPTQ and AWQ written by their own tools do not round to nearest; AutoRound's exports in
    their formats (``autoround_version``, ``provider: auto-round``) do."""
    by_auto_round = "autoround_version" in q or q.get("provider") == "auto-round"
    if method is Method.GPTQ and not by_auto_round:
        return Rounding.ERROR_FEEDBACK
    if method is Method.AWQ and not by_auto_round:
        return Rounding.ACTIVATION_SCALED
    return Rounding.NEAREST


def _bnb_bits(q: Mapping[str, Any]) -> int | None:
    """bitsandbytes' element width: 4 (``load_in_4bit``) or 8 (``load_in_8bit``)."""
    return 4 if q.get("load_in_4bit") is True else 8 if q.get("load_in_8bit") is True else None


def _modelopt_scheme(hf_quant_config: Mapping[str, Any]) -> Scheme:
    """NVIDIA modelopt's ``hf_quant_config.json``."""
    inner = hf_quant_config.get("quantization")
    inner = inner if isinstance(inner, Mapping) else {}
    return Scheme(
        Method.MODELOPT,
        "modelopt",
        _strings(inner.get("quant_algo")),
        None,
        _strings(inner.get("exclude_modules")),
        group_size=_first_int([inner.get("group_size")]),
    )


def _mlx_scheme(q: Mapping[str, Any]) -> Scheme:
    """mlx-lm's top-level ``quantization``: ``bits``, ``group_size`` and ``mode`` (affine
    when absent); per-module entries (dicts keyed by module path) override them."""
    mode = q.get("mode")
    return Scheme(
        Method.MLX,
        "mlx",
        (mode if isinstance(mode, str) else "affine",),
        weight_bits=_first_int([q.get("bits")]),
        group_size=_first_int([q.get("group_size")]),
    )


def declared_scheme(ckpt: Checkpoint) -> Scheme:
    """The scheme ``ckpt`` declares, in its config or beside it (``hf_quant_config.json``)."""
    quant = ckpt.quant_config if isinstance(ckpt, DeclaresQuantization) else None
    return scheme_of(ckpt.config, quant)
