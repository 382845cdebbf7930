"""Load pickled checkpoint files without running code from them.

Megatron checkpoints are pickles: ``.pt`` files written by ``torch.save`` (``common.pt``,
``model_optim_rng.pt``) and the raw pickle ``.metadata`` of a torch.distributed.checkpoint (DCP)
save. Unpickling calls whatever callable the file names, so a hostile file can run code. Every
loader here resolves only an allowlist of globals:

* ``.pt`` files are zip archives (:mod:`mtpcheck.formats.torch_save_file`) whose ``data.pkl``
  is read by a restricted :class:`pickle.Unpickler`: torch's tensor, storage and dtype globals
  resolve to inert stand-ins (:mod:`mtpcheck.formats.torch_pickle`), so a tensor is a
  :class:`~mtpcheck.formats.torch_pickle.StoredTensor` whose bytes stay in the file, read by
  position when used; besides them only plain containers and the few standard-library types
  megatron-core allowlists for its own loads (``argparse`` and ``types`` namespaces, ``pathlib``
  paths as text, ``io.BytesIO``, ``signal.Signals`` as its number) resolve.
* ``.metadata`` uses a restricted :class:`pickle.Unpickler` that knows the DCP metadata classes
  (as inert stand-ins that store their fields), ``torch.Size``, dtypes, ``pathlib`` paths and
  plain containers.

Whatever a global resolves to, the file cannot change it (:mod:`mtpcheck.formats.inert`): the
classes are made for one load and refuse new attributes, the functions take no state, and the
values refuse state once made. A pickle's opcodes are walked first
(:mod:`mtpcheck.formats.pickle_scan`), so what loading it costs is bounded by its size.

Nothing here imports torch: Megatron checkpoints are read with the core install.
Classes from ``megatron*`` modules, and in ``.pt`` files the numpy arrays of a saved RNG
state, become :class:`Placeholder` objects that only store their state, so neither megatron nor
numpy is imported. ``trust_pickle=True`` lifts the allowlist (megatron classes still become
placeholders and torch's globals stand-ins); use it only for files from a trusted source.
"""

from __future__ import annotations

import builtins
import collections
import io
import pathlib
import pickle
import re
from pathlib import Path
from typing import Any

from mtpcheck.errors import InputError, RefusedInput, raised_by_us, shown, shown_text
from mtpcheck.formats.chunked_read import read_capped
from mtpcheck.formats.inert import ON_CLASS, InertCall, LoadScope, RefusedChange
from mtpcheck.formats.pickle_scan import scan
from mtpcheck.formats.torch_pickle import TorchReadError, storage_ref, torch_global
from mtpcheck.formats.torch_save_file import Archive

PLACEHOLDER_PREFIXES = ("megatron",)
"""Modules whose classes are replaced by inert placeholders."""


class Placeholder:
    """Inert stand-in for a class of an unavailable module: it only records its state. Each
    load makes its own subclass per class name (:class:`~mtpcheck.formats.inert.LoadScope`)."""

    _qualified_name = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Placeholder:
        obj = super().__new__(cls)
        obj.__dict__["_args"] = args
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__dict__["_args"] = args

    def __setstate__(self, state: Any = ON_CLASS) -> None:
        if state is ON_CLASS:  # BUILD on the class: pickle calls this with the state alone
            raise RefusedChange("the pickle changes a class it was handed")
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self.__dict__["_state"] = state

    def __repr__(self) -> str:
        return f"<{self._qualified_name}>"


def _is_placeholder_module(module: str) -> bool:
    return module.split(".", 1)[0].startswith(PLACEHOLDER_PREFIXES)


_TORCH_DATA_TYPE = re.compile(
    r"torch\.(?:[A-Z][A-Za-z0-9]*Storage|(?:b?float|complex|u?int|q?u?int|bits)[0-9a-z_]*"
    r"|_utils\._rebuild_(?:qtensor|sparse_tensor|sparse_csr_tensor|nested_tensor|wrapper_subclass))"
)
"""torch's own dtype, storage and tensor-kind globals: a legitimate checkpoint names them."""


def _refusal(path: str | Path, qualified_name: str) -> InputError:
    name = shown_text(qualified_name, 200)
    if _TORCH_DATA_TYPE.fullmatch(qualified_name):
        return InputError(
            path,
            f"holds a tensor of {name}, a type mtpcheck does not read (an unsupported dtype or "
            "tensor kind, not an attack: nothing was loaded or run)",
        )
    return InputError(
        path,
        f"refusing to unpickle {name} (not on the allowlist); loading this file could run "
        "arbitrary code",
    )


# --- .pt files: torch.load(weights_only=True) with a few extra globals ----------------------

_NUMPY_GLOBALS = frozenset(
    {
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
        "numpy.ndarray",
        "numpy.dtype",
    }
)
"""What a pickled numpy array or scalar names; Megatron-LM's saved RNG state holds some."""


def _path_text(flavour: type[pathlib.PurePath]) -> InertCall:
    """A pickled path as its text: a ``str``, which no file can change (the path classes
    themselves are never handed out)."""

    def make(*parts: Any) -> str:
        if not all(type(p) is str for p in parts):
            raise TorchReadError(f"{flavour.__name__} of {shown(parts)}")
        return str(flavour(*parts))

    return InertCall(f"pathlib.{flavour.__name__}", make)


def _signal(value: Any) -> int:
    """``signal.Signals(15)`` as its number (an enum member is shared by the process)."""
    import signal

    if type(value) is not int or value not in {int(s) for s in signal.Signals}:
        raise TorchReadError(f"signal {shown(value)}")
    return value


_PATHS = {
    "PosixPath": _path_text(pathlib.PurePosixPath),
    "PurePosixPath": _path_text(pathlib.PurePosixPath),
    "WindowsPath": _path_text(pathlib.PureWindowsPath),
    "PureWindowsPath": _path_text(pathlib.PureWindowsPath),
}
_SIGNAL = InertCall("signal.Signals", _signal)


def _plain_pt_global(qualified_name: str, scope: LoadScope) -> Any | None:
    """The standard-library types Megatron's own ``weights_only`` loads allow, or None."""
    if qualified_name == "argparse.Namespace":
        import argparse

        return scope.frozen(qualified_name, argparse.Namespace)
    if qualified_name == "types.SimpleNamespace":
        import types as types_module

        return scope.frozen(qualified_name, types_module.SimpleNamespace)
    if qualified_name in ("pathlib.PosixPath", "pathlib._local.PosixPath"):
        return _PATHS["PosixPath"]
    if qualified_name == "_io.BytesIO":
        return io.BytesIO  # a builtin type: nothing of it can be set
    if qualified_name == "signal.Signals":
        return _SIGNAL
    return None


def _extra_pt_global(qualified_name: str, scope: LoadScope) -> Any | None:
    """Resolve a global allowed in ``.pt`` files beyond torch's defaults, or None.

    These are the globals megatron-core itself allowlists for its ``weights_only`` loads
    (``args`` holds a Namespace, enums and an exit signal; TE extra state is a BytesIO).
    megatron classes and numpy values (RNG state) are never needed, so they load as
    placeholders: no megatron or numpy code runs while unpickling.
    """
    module = qualified_name.rpartition(".")[0]
    if _is_placeholder_module(module) or qualified_name in _NUMPY_GLOBALS:
        return scope.frozen(qualified_name, Placeholder)
    return _plain_pt_global(qualified_name, scope)


def _pt_global(module: str, name: str, scope: LoadScope) -> Any | None:
    """Resolve a global a ``.pt`` file may name, or None: torch's tensor, storage and dtype
    globals as inert stand-ins (:mod:`mtpcheck.formats.torch_pickle`), plain containers, and
    the few standard-library types megatron-core allowlists for its own loads."""
    found = torch_global(module, name)
    if found is not None:
        return found
    found = _extra_pt_global(f"{module}.{name}", scope)
    return found if found is not None else _container_global(module, name)


class _PtUnpickler(pickle.Unpickler):
    """A ``data.pkl`` whose tensors become :class:`StoredTensor` records of ``archive``;
    only allowlisted globals resolve, unless ``trusting`` (megatron classes still become
    placeholders then, and torch's own globals stand-ins)."""

    def __init__(self, file: Any, path: str | Path, archive: Archive, trusting: bool) -> None:
        super().__init__(file)
        self._path, self._archive, self._trusting = path, archive, trusting
        self._scope = LoadScope()

    def find_class(self, module: str, name: str) -> Any:
        obj = _pt_global(module, name, self._scope)
        if obj is not None:
            return obj
        if self._trusting:
            return super().find_class(module, name)
        raise _refusal(self._path, f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        ref = storage_ref(pid, self._archive)
        self._archive.check(ref)
        return ref


def load_torch_file(
    path: str | Path,
    *,
    trust_pickle: bool = False,
    blob: bytes | None = None,
    window: tuple[int, int] | None = None,
) -> Any:
    """Load a ``torch.save`` file without torch: tensors become :class:`StoredTensor` records
    whose bytes stay in the file, read by position when used.

    ``window`` is the archive's ``(start, length)`` in ``path`` (a DCP chunk); ``blob`` an
    archive held in memory, named ``path`` in errors (megatron-core >= 0.19 keeps its common
    state as such a blob inside a data file).
    """
    try:
        archive = Archive(path, window, blob)
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    except TorchReadError as e:
        raise InputError(path, f"unreadable torch.save file ({e})") from e
    try:
        return unpickle_archive(archive, path, trust_pickle=trust_pickle)
    except (TorchReadError, ValueError) as e:
        raise InputError(path, f"unreadable torch.save file ({e})") from e
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    finally:
        archive.close()


def unpickle_archive(
    archive: Archive, path: str | Path, *, trust_pickle: bool = False, max_bytes: int | None = None
) -> Any:
    """The object of an open archive's ``data.pkl`` (see :func:`load_torch_file`)."""
    try:
        data = archive.pickle_bytes(max_bytes)
    except TorchReadError as e:
        raise InputError(path, f"unreadable torch.save file ({e})") from e
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    unpickler = _PtUnpickler(io.BytesIO(data), path, archive, trust_pickle)
    return _load(unpickler, data, path, "unreadable torch.save file")


def _load(unpickler: pickle.Unpickler, data: bytes, path: str | Path, what: str) -> Any:
    """Run ``unpickler`` over ``data`` (its opcodes walked first, :func:`scan`): what the file
    holds or names that mtpcheck refuses is an :class:`InputError` (``what``, and why), an
    error raised in mtpcheck's own code on the way is not caught (a bug of ours: exit 3)."""
    try:
        scan(data)
        return unpickler.load()
    except InputError:
        raise
    except Exception as e:
        if raised_by_us(e):
            raise
        said = shown_text(str(e)) if isinstance(e, RefusedInput) else _one_line(e)
        raise InputError(path, f"{what} ({said})") from e


class _TrustingUnpickler(pickle.Unpickler):
    """Unrestricted, except that megatron classes become placeholders (no megatron import)
    and torch's own globals stand-ins (no torch import)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self._scope = LoadScope()

    def find_class(self, module: str, name: str) -> Any:
        obj = _metadata_global(module, name, self._scope)  # placeholders, stand-ins first
        return obj if obj is not None else super().find_class(module, name)


# --- raw pickles: the DCP .metadata file ----------------------------------------------------

_DCP_METADATA_CLASSES = frozenset(
    {
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    }
)
_BUILTINS = frozenset({"dict", "list", "tuple", "set", "frozenset", "complex", "slice"})
"""Builtin types a pickle of data names: nothing of them can be set, and each makes an object
of the arguments it is given, no larger than they are."""


_DCP_DATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": _DCP_METADATA_CLASSES,
    # a save plan kept in ``Metadata.planner_data`` (Megatron-Bridge's saves hold one)
    "torch.distributed.checkpoint.planner": frozenset(
        {
            "SavePlan",
            "LoadPlan",
            "WriteItem",
            "ReadItem",
            "WriteItemType",
            "LoadItemType",
            "TensorWriteData",
            "BytesIOWriteData",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset(
        {"_StorageInfo", "_StoragePrefix", "SerializationFormat"}
    ),
}
"""DCP classes a ``.metadata`` pickle may name, per module. Each is a plain dataclass or enum:
building one only stores fields (no ``__reduce__``, ``__setstate__`` or ``__init__`` with side
effects), so none of them can be turned into a call of something else. Writers, readers,
planners and storage extensions of the same modules stay refused."""


class _TensorProperties(Placeholder):
    """DCP's ``TensorProperties`` pickles its fields as a tuple (``__getstate__``)."""

    _qualified_name = "torch.distributed.checkpoint.metadata.TensorProperties"
    _FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")

    def __setstate__(self, state: Any = ON_CLASS) -> None:
        if isinstance(state, tuple) and len(state) == len(self._FIELDS):
            self.__dict__.update(zip(self._FIELDS, state, strict=True))
        else:
            super().__setstate__(state)


def _dcp_class(module: str, name: str, scope: LoadScope) -> type | None:
    """This load's inert stand-in of an allowlisted DCP data class: it stores the fields it is
    given."""
    if name not in _DCP_DATA_CLASSES.get(module, ()):
        return None
    base = _TensorProperties if name == "TensorProperties" else Placeholder
    return scope.frozen(f"{module}.{name}", base)


def _data_bytes(*args: Any) -> bytes:
    """``bytes`` and ``bytearray`` as protocol 2 pickles them: ``()`` or ``(text, "latin1")``
    (never ``bytes(n)``, which would make ``n`` bytes out of a few)."""
    if args == ():
        return b""
    if len(args) == 2 and type(args[0]) is str and args[1] in _LATIN1:
        return args[0].encode("latin-1")
    if len(args) == 1 and type(args[0]) in (bytes, bytearray):
        return bytes(args[0])
    raise TorchReadError(f"bytes of {shown(args)}")


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    """``_codecs.encode``, as protocol 2 pickles bytes with it: text to latin-1 bytes."""
    if type(text) is not str or encoding not in _LATIN1:
        raise TorchReadError(f"_codecs.encode of {shown((text, encoding))}")
    return text.encode("latin-1")


_LATIN1 = ("latin1", "latin-1")
_DATA_CALLS = {
    ("builtins", "bytes"): InertCall("builtins.bytes", _data_bytes),
    ("builtins", "bytearray"): InertCall("builtins.bytearray", _data_bytes),
    ("_codecs", "encode"): InertCall("_codecs.encode", _encode),
}


def _container_global(module: str, name: str) -> Any | None:
    """Plain containers and the bytes codec a pickle of data names, or None."""
    if (module, name) == ("collections", "OrderedDict"):
        return collections.OrderedDict  # a builtin type: nothing of it can be set
    if module == "__builtin__":
        module = "builtins"
    if module == "builtins" and name in _BUILTINS:
        return getattr(builtins, name)
    return _DATA_CALLS.get((module, name))


def _metadata_global(module: str, name: str, scope: LoadScope) -> Any | None:
    """Resolve an allowlisted global of a DCP ``.metadata`` pickle, or None."""
    if _is_placeholder_module(module):
        return scope.frozen(f"{module}.{name}", Placeholder)
    found = _dcp_class(module, name, scope) or torch_global(module, name)
    if found is not None:
        return found
    if module in ("pathlib", "pathlib._local"):
        return _PATHS.get(name)  # a path's text; WindowsPath cannot be made on POSIX anyway
    return _container_global(module, name)


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only allowlisted globals; anything else raises :class:`InputError`."""

    def __init__(self, file: Any, path: str | Path) -> None:
        super().__init__(file)
        self._path = path
        self._scope = LoadScope()

    def find_class(self, module: str, name: str) -> Any:
        obj = _metadata_global(module, name, self._scope)
        if obj is None:
            raise _refusal(self._path, f"{module}.{name}")
        return obj

    def persistent_load(self, pid: Any) -> Any:
        raise InputError(self._path, "unexpected persistent id in a plain pickle")


MAX_RAW_PICKLE_BYTES = 1024 * 1024 * 1024
"""A ``.metadata`` holds a few hundred bytes a tensor chunk: a gigabyte is millions of them."""


def load_raw_pickle(path: str | Path, *, trust_pickle: bool = False) -> Any:
    """Load a plain pickle file (a DCP ``.metadata``) with the restricted unpickler."""
    data = read_capped(path, MAX_RAW_PICKLE_BYTES)
    unpickler: pickle.Unpickler = (
        _TrustingUnpickler(io.BytesIO(data))
        if trust_pickle
        else _RestrictedUnpickler(io.BytesIO(data), path)
    )
    return _load(unpickler, data, path, "unreadable pickle")


def _one_line(e: BaseException) -> str:
    text = [line.strip() for line in shown_text(str(e)).strip().splitlines() if line.strip()]
    marker = "WeightsUnpickler error:"  # torch puts the real cause after a generic preamble
    for i, line in enumerate(text):
        at = line.find(marker)
        if at >= 0:
            rest = line[at + len(marker) :].strip() or (text[i + 1] if i + 1 < len(text) else "")
            return rest or type(e).__name__
    first = text[0] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
