"""Pieces shared by the Megatron readers: directory layout, canonical names, config, bytes.

Canonical tensor names are those of ``GPTModel.state_dict()`` built with megatron-core's *local*
(non-Transformer-Engine) layer spec, one tensor per layer and per expert. The spelling rules
(``mtp_model_layer`` spelled ``transformer_layer``, fused norms unfused, MLA fused norms kept)
are :func:`mtpcheck.formats.torch_dist_keys.canonical_name`'s, shared with the torch_dist
writer; :func:`canonical_name` here is that function.

Layer stacking and expert axes are format specific (torch_dist's in
:mod:`mtpcheck.formats.torch_dist_keys`, the legacy format's in its reader), and so are
per-rank shards.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeGuard

from mtpcheck.errors import InputError, shown
from mtpcheck.formats.chunked_read import SMALL_FILE_BYTES, read_text_capped
from mtpcheck.formats.torch_dist_keys import DECODER_LAYER
from mtpcheck.formats.torch_dist_keys import canonical_name as canonical_name  # re-exported
from mtpcheck.units import first_few

TRACKER_FILE = "latest_checkpointed_iteration.txt"
RUN_CONFIG_FILE = "run_config.yaml"
MODEL_TYPE = "megatron"

_ITERATION_DIR = re.compile(r"^(iter_\d{7,}|release)$")

EMBEDDING_NAMES = ("embedding.word_embeddings.weight", "output_layer.weight")
"""Tensors whose rows are the (possibly padded) vocabulary."""


WRAPPER_PREFIXES = ("language_model.",)
"""Where a Megatron vision-language model keeps its language model (Megatron-Bridge's
Qwen3-VL / Qwen3.5-VL models: ``language_model.decoder...``, ``language_model.mtp...`` beside
``vision_model.*``). The readers name its tensors without the prefix, as a plain GPT model's."""
_LM_HEADS = ("decoder.", "mtp.", "embedding.", "output_layer.")


def wrapper_prefix(names: Iterable[str]) -> str:
    """The prefix a checkpoint's language model lives under (``""`` when it is at the top)."""
    names = list(names)
    if any(n.startswith(_LM_HEADS) for n in names):
        return ""
    for prefix in WRAPPER_PREFIXES:
        if any(n.startswith(prefix + head) for n in names for head in _LM_HEADS):
            return prefix
    return ""


_ANY_DIGITS = re.compile(r"\d+")  # ``\d``: any Unicode digit, as int() reads them
MAX_DIGITS = 18
"""Digits of the largest layer, expert or rank number mtpcheck reads (int() refuses more than
4300, and no checkpoint holds 10**18 of anything)."""


def odd_number(key: str) -> str | None:
    """A number in a tensor key spelled as no writer spells one, or None: digits other than
    ASCII, leading zeros, or more than :data:`MAX_DIGITS` digits. ``int()`` reads such a
    spelling as a plain number, so two keys would name one layer (or expert): ambiguous."""
    for m in _ANY_DIGITS.finditer(key):
        text = m.group(0)
        if not text.isascii() or (len(text) > 1 and text[0] == "0") or len(text) > MAX_DIGITS:
            return text
    return None


def inside(relative: Any) -> TypeGuard[str]:
    """Whether a path a checkpoint's index names stays inside the checkpoint's directory: a
    plain ``str`` (no object whose behaviour a file set), relative, without a ``..`` or empty
    component and without NUL, judged on its text alone."""
    if type(relative) is not str or not relative or "\0" in relative:
        return False
    parts = relative.replace("\\", "/").split("/")
    return (
        relative[0] not in "/\\" and ":" not in parts[0] and all(p not in ("", "..") for p in parts)
    )


def is_model_key(key: str) -> bool:
    """False for optimizer, RNG and other non-model items, and for ``_extra_state``."""
    if "_extra_state" in key:
        return False
    head = key.split(".", 1)[0].split("/", 1)[0]
    return head not in {
        "optimizer",
        "rng_state",
        "rerun_state_machine",
        "opt_param_scheduler",
        "train_state",
        "dataloader_state",
    }


# --- directory layout ---------------------------------------------------------------------


def resolve_iteration_dir(path: Path) -> Path:
    """Follow ``latest_checkpointed_iteration.txt`` from a save root; other paths pass through."""
    tracker = path / TRACKER_FILE
    if not tracker.is_file():
        return path
    text = read_text_capped(tracker, SMALL_FILE_BYTES).strip()
    if text == "release":
        target = path / "release"
    elif text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS:
        target = path / f"iter_{int(text):07d}"
    else:
        raise InputError(tracker, f"expected an iteration number or 'release', found {shown(text)}")
    if not target.is_dir():
        raise InputError(tracker, f"names iteration {text}, but {target.name}/ does not exist")
    return target


def iteration_dirs(path: Path) -> list[Path]:
    """The ``iter_XXXXXXX`` and ``release`` folders directly under ``path``."""
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and _ITERATION_DIR.match(p.name))
    except OSError:
        return []


class MegatronReaderBase:
    """What both Megatron readers share: ``trust_pickle`` (the restricted unpickler's allowlist
    lifted, for files from a trusted source: :mod:`mtpcheck.formats.safe_pickle`) and finding
    the iteration directory to read, by the tracker file of a save root. A reader names its
    checkpoints (``what``), recognises their directories (``looks``) and says whether a broken
    tracker passes ``sniff`` (for ``open`` to report)."""

    what: ClassVar[str]
    broken_tracker_sniffs: ClassVar[bool]

    def __init__(self, trust_pickle: bool = False) -> None:
        self.trust_pickle = trust_pickle

    def looks(self, directory: Path) -> bool:
        """True when ``directory`` holds this reader's checkpoint files."""
        raise NotImplementedError

    def sniff_dir(self, path: Path) -> bool:
        """Whether directory ``path`` holds a checkpoint this reader recognises: the iteration
        its tracker file names, else ``path`` itself or one of its iteration directories."""
        if (path / TRACKER_FILE).is_file():
            try:
                return self.looks(resolve_iteration_dir(path))
            except InputError:
                return self.broken_tracker_sniffs
        return self.looks(path) or any(self.looks(d) for d in iteration_dirs(path))

    def iteration_dir(self, path: Path, start: Path) -> Path:
        """The directory to read for ``path``: ``start``, or the iteration its tracker file
        names; :class:`InputError` when ``path`` does not exist or that directory holds no
        checkpoint of this reader's."""
        if not path.exists():
            raise InputError(path, "no such file or directory")
        directory = resolve_iteration_dir(start)
        if not self.looks(directory):
            raise no_iteration_error(directory, self.what)
        return directory


def no_iteration_error(path: Path, what: str) -> InputError:
    """The error for a directory that holds neither a checkpoint nor a tracker file."""
    found = iteration_dirs(path)
    if found:
        names = first_few([p.name for p in found], 3, counted=False)
        return InputError(
            path, f"no {TRACKER_FILE}; pass one of the iteration directories ({names})"
        )
    return InputError(path, f"not a {what} checkpoint directory")


# --- config ---------------------------------------------------------------------------------


MAX_NESTING = 32
"""How deep a saved config value may nest (Megatron's args nest two or three levels)."""


def json_safe(value: Any, depth: int = 0) -> tuple[bool, Any]:
    """(True, value) when ``value`` is plain JSON data (tuples become lists), no deeper than
    :data:`MAX_NESTING` and without an int past 64 bits; else (False, None)."""
    if value is None or isinstance(value, (bool, str)):
        return True, value
    if isinstance(value, int):
        return (-(2**63) <= value < 2**64, value if -(2**63) <= value < 2**64 else None)
    if isinstance(value, float):
        return (math.isfinite(value), value if math.isfinite(value) else None)
    if depth >= MAX_NESTING:
        return False, None
    if isinstance(value, (list, tuple)):
        out = []
        for item in value:
            ok, safe = json_safe(item, depth + 1)
            if not ok:
                return False, None
            out.append(safe)
        return True, out
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            ok, safe = json_safe(item, depth + 1)
            if not isinstance(key, str) or not ok:
                return False, None
            result[key] = safe
        return True, result
    return False, None


def config_from_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the JSON-safe entries of ``values`` (an ``args`` namespace or a YAML section)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        ok, safe = json_safe(value)
        if ok and isinstance(key, str):
            out[key] = safe
    return out


def args_config(args: Any) -> dict[str, Any]:
    """Config entries from a Megatron-LM ``args`` namespace (or dict); ``{}`` for anything else."""
    if isinstance(args, Mapping):
        return config_from_mapping(args)
    fields = getattr(args, "__dict__", None)
    return config_from_mapping(fields) if isinstance(fields, dict) else {}


def unpadded_rows(config: Mapping[str, Any], stored_rows: int) -> int | None:
    """Rows to keep of a vocab tensor: ``vocab_size`` when the args declare padding beyond it."""
    vocab = config.get("vocab_size")
    padded = config.get("padded_vocab_size")
    if not isinstance(vocab, int) or not isinstance(padded, int) or isinstance(vocab, bool):
        return None
    if 0 < vocab < stored_rows and padded == stored_rows:
        return vocab
    return None


def default_layer_count(config: dict[str, Any], names: Iterable[str]) -> None:
    """Where no saved config declares ``num_layers``, set it in ``config`` to the number of
    distinct ``decoder.layers.{k}`` indices among the canonical tensor ``names``."""
    if "num_layers" not in config:
        found = {int(m.group(1)) for n in names if (m := DECODER_LAYER.match(n))}
        config["num_layers"] = len(found)


# --- dtypes and bytes -----------------------------------------------------------------------


def tensor_chunks(elements: Any, chunk_bytes: int) -> Iterator[bytes]:
    """Raw little-endian bytes of a tensor's elements (a numpy array of its element width,
    :meth:`~mtpcheck.formats.torch_pickle.StoredTensor.elements`) in C order, at most
    ``chunk_bytes`` at a time.

    The bytes are reinterpreted, never converted, so bf16, fp8 and NaN payloads are exact.
    """
    import numpy as np

    flat = np.ascontiguousarray(elements).reshape(-1).view(np.uint8)
    view = flat.data  # a memoryview of the array's bytes
    step = max(1, chunk_bytes)
    for start in range(0, len(view), step):
        yield bytes(view[start : start + step])
