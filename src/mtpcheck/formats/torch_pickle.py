"""What a ``torch.save`` pickle names, resolved without torch.

A ``torch.save`` file's ``data.pkl`` and a torch.distributed.checkpoint ``.metadata`` name
torch's own globals: tensor rebuild functions, storage classes, dtypes, ``torch.Size``,
layouts, devices. mtpcheck needs none of torch's behaviour behind them, only what they record,
so each resolves here to an inert stand-in:

* a tensor becomes a :class:`StoredTensor`: its dtype, shape, strides and the storage its
  bytes lie in (:class:`StorageRef`); no byte of it is read while unpickling;
* a dtype becomes a :class:`TorchDType` (``str()`` gives ``torch.<name>``, as torch's does);
* ``torch.Size`` gives a tuple; a layout, memory format or device a :class:`TorchName`.

Only the globals listed here resolve; :func:`torch_global` answers None for any other, and
the caller refuses it. Each resolves to an :class:`~mtpcheck.formats.inert.InertCall` or a
:class:`~mtpcheck.formats.inert.Sealed` value made for the call, so a file cannot change how it
or a later file is read (:mod:`mtpcheck.formats.inert`). Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mtpcheck.dtypes import BY_STORAGE, BY_TORCH, DType
from mtpcheck.errors import RefusedInput, shown
from mtpcheck.formats.inert import InertCall, Sealed


class TorchReadError(RefusedInput):
    """A tensor record this module cannot describe (the loader words it for the file)."""


@dataclass(frozen=True)
class TorchDType(Sealed):
    """A ``torch.<name>`` dtype of a whole-byte width, known to :mod:`mtpcheck.dtypes`."""

    name: str

    @property
    def code(self) -> str:
        """safetensors dtype code."""
        return BY_TORCH[self.name].code

    @property
    def itemsize(self) -> int:
        """Bytes per element (0 for a type the dtype registry does not size)."""
        return BY_TORCH[self.name].itemsize or 0

    def __str__(self) -> str:
        return f"torch.{self.name}"


@dataclass(frozen=True)
class TorchName(Sealed):
    """A layout, memory format or device: only its name is kept."""

    name: str

    def __str__(self) -> str:
        return f"torch.{self.name}"


class StorageBytes(Protocol):
    """Where a file's storages lie: their bytes as a flat uint8 array, by storage key."""

    def storage(self, key: str) -> Any:
        """The bytes of storage ``key`` as a flat uint8 array."""
        ...


@dataclass(frozen=True)
class StorageType(Sealed):
    """A typed storage class (``torch.BFloat16Storage``), or the untyped byte storage."""

    dtype: DType | None


@dataclass(frozen=True, eq=False)
class StorageRef(Sealed):
    """One storage of the file: ``numel`` elements of ``itemsize`` bytes at ``key``."""

    key: str
    dtype: DType | None
    """None for an untyped (byte) storage: the tensor names its dtype."""
    numel: int
    source: StorageBytes | None


@dataclass(frozen=True, eq=False)
class StoredTensor(Sealed):
    """A saved tensor, described and not read: :meth:`elements` maps its bytes."""

    dtype: str
    """safetensors dtype code."""
    itemsize: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    """In elements."""
    storage: StorageRef

    @property
    def numel(self) -> int:
        """Elements the tensor holds."""
        return math.prod(self.shape)

    def is_c_contiguous(self) -> bool:
        """True when the strides are those of a C-ordered tensor (size-1 axes excepted)."""
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self.stride), strict=True):
            if size > 1 and stride != expected:
                return False
            expected *= size
        return True

    def elements(self) -> Any:
        """The tensor as a read-only numpy array of unsigned ints of its element width (or
        raw ``V<n>`` items): its bytes reinterpreted, never converted."""
        return elements_of(self)


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TorchReadError(f"not a non-negative int: {shown(value)}")
    return value


def _ints(value: Any) -> tuple[int, ...]:
    if not isinstance(value, tuple):
        raise TorchReadError(f"not a tuple: {shown(value)}")
    return tuple(_int(v) for v in value)


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: DType) -> StoredTensor:
    width = dtype.itemsize
    if width is None:
        raise TorchReadError(f"dtype {dtype.code} has no whole-byte width")
    shape, strides = _ints(size), _ints(stride)
    if len(shape) != len(strides):
        raise TorchReadError(f"shape {list(shape)} with strides {list(strides)}")
    tensor = StoredTensor(dtype.code, width, shape, strides, _int(offset), storage)
    if tensor.numel:
        held = storage.numel * (storage.dtype.itemsize if storage.dtype else 1) // width
        last = tensor.storage_offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        if last >= held:
            raise TorchReadError(f"tensor {list(shape)} reaches past its storage")
        if tensor.numel > held:  # strides of 0 (an expanded tensor): elements alias each other
            raise TorchReadError(
                f"tensor {list(shape)} with strides {list(strides)} has {tensor.numel} elements, "
                f"more than the {held} its storage holds (expanded; not read)"
            )
    return tensor


def rebuild_tensor_v2(
    storage: Any, offset: Any, size: Any, stride: Any, *rest: Any
) -> StoredTensor:
    """``torch._utils._rebuild_tensor_v2``: a tensor of a typed storage."""
    if not isinstance(storage, StorageRef) or storage.dtype is None:
        raise TorchReadError("tensor without a typed storage")
    return _tensor(storage, offset, size, stride, storage.dtype)


def rebuild_tensor_v3(
    storage: Any, offset: Any, size: Any, stride: Any, grad: Any, hooks: Any, dtype: Any, *rest: Any
) -> StoredTensor:
    """``torch._utils._rebuild_tensor_v3``: a tensor of an untyped byte storage (how dtypes
    without a typed storage class, e.g. float8, are saved)."""
    if not isinstance(storage, StorageRef) or storage.dtype is not None:
        raise TorchReadError("tensor without an untyped storage")
    if not isinstance(dtype, TorchDType):
        raise TorchReadError(f"dtype {shown(dtype, 200)}")
    width = dtype.itemsize
    if storage.numel % width:
        raise TorchReadError("byte storage not a whole number of elements")
    return _tensor(storage, offset, size, stride, BY_TORCH[dtype.name])


def _parameter(data: Any, *rest: Any) -> Any:
    """``_rebuild_parameter`` / ``_rebuild_parameter_with_state``: a Parameter is its data."""
    if not isinstance(data, StoredTensor):
        raise TorchReadError("parameter without a tensor")
    return data


def _marker(*args: Any, **kwargs: Any) -> Any:
    raise TorchReadError("torch.Tensor called")


TENSOR_TYPE = InertCall("torch.Tensor", _marker)
"""``torch.Tensor`` / ``torch.nn.Parameter`` as a ``_rebuild_from_type_v2`` names them."""


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    """A tensor saved with its Python type (plain Tensor or Parameter only), rebuilt by one of
    the tensor rebuilders here and nothing else."""
    if new_type is not TENSOR_TYPE or func not in _REBUILDERS or not isinstance(args, tuple):
        raise TorchReadError("tensor of another type, or rebuilt by something else")
    return func(*args)


def _size(value: Any = ()) -> tuple[int, ...]:
    """``torch.Size``: a tuple of sizes."""
    if not isinstance(value, tuple | list) or not all(isinstance(v, int) for v in value):
        raise TorchReadError(f"torch.Size of {shown(value)}")
    return tuple(value)


def _layout(name: Any) -> TorchName:
    """``torch.serialization._get_layout("torch.strided")``."""
    if not isinstance(name, str):
        raise TorchReadError(f"layout {shown(name)}")
    return TorchName(name.removeprefix("torch."))


def _device(name: Any, index: Any = None) -> TorchName:
    """``torch.device("cpu")``: only its name is kept."""
    if not isinstance(name, str):
        raise TorchReadError(f"device {shown(name)}")
    return TorchName(name)


_LAYOUTS = frozenset({"strided", "sparse_coo", "sparse_csr", "_mkldnn", "jagged"})
_MEMORY_FORMATS = frozenset(
    {"contiguous_format", "channels_last", "channels_last_3d", "preserve_format"}
)

_REBUILD: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch._utils", "_rebuild_tensor_v2"): rebuild_tensor_v2,
    ("torch._utils", "_rebuild_tensor_v3"): rebuild_tensor_v3,
    ("torch._utils", "_rebuild_parameter"): _parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _parameter,
}
_FUNCTIONS: dict[tuple[str, str], InertCall] = {
    **{(m, n): InertCall(f"{m}.{n}", call) for (m, n), call in _REBUILD.items()},
    ("torch._tensor", "_rebuild_from_type_v2"): InertCall(
        "torch._tensor._rebuild_from_type_v2", _rebuild_from_type_v2
    ),
    ("torch", "Tensor"): TENSOR_TYPE,
    ("torch.nn.parameter", "Parameter"): TENSOR_TYPE,
    ("torch", "Size"): InertCall("torch.Size", _size),
    ("torch", "device"): InertCall("torch.device", _device),
    ("torch.serialization", "_get_layout"): InertCall("torch.serialization._get_layout", _layout),
}
_REBUILDERS = frozenset(_FUNCTIONS[key] for key in _REBUILD)
"""What ``_rebuild_from_type_v2`` may call: a tensor's own rebuilders."""


def torch_global(module: str, name: str) -> Any | None:
    """The stand-in of a torch global a pickle may name, or None where there is none; values
    (a dtype, a storage type) are made for the call, so no file shares one with another."""
    found = _FUNCTIONS.get((module, name))
    if found is not None:
        return found
    if (module, name) == ("torch.storage", "UntypedStorage"):
        return StorageType(None)
    if module != "torch":
        return None
    if name in BY_STORAGE:
        return StorageType(BY_STORAGE[name])
    dtype = BY_TORCH.get(name)
    if dtype is not None and dtype.itemsize:
        return TorchDType(name)
    if name in _LAYOUTS or name in _MEMORY_FORMATS:
        return TorchName(name)
    return None


def storage_ref(pid: Any, source: StorageBytes | None) -> StorageRef:
    """The storage a ``torch.save`` persistent id names: ``('storage', type, key, location,
    numel)``."""
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
        raise TorchReadError(f"persistent id {shown(pid)}")
    kind, key, numel = pid[1], pid[2], pid[4]
    if not isinstance(kind, StorageType) or type(key) is not str:
        raise TorchReadError(f"storage {shown(pid[:3])}")
    return StorageRef(key, kind.dtype, _int(numel), source)


_UNSIGNED = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}


def element_type(itemsize: int) -> Any:
    """The numpy type that holds one element's bytes unchanged."""
    import numpy as np

    return np.dtype(_UNSIGNED.get(itemsize, f"V{itemsize}"))


def elements_of(tensor: StoredTensor) -> Any:
    """The tensor as a read-only numpy array of unsigned ints of its element width (or raw
    ``V<n>`` items): its bytes reinterpreted, never converted."""
    import numpy as np

    storage = tensor.storage
    if storage.source is None:
        raise TorchReadError("tensor without its file")
    flat = storage.source.storage(storage.key)  # its size checked when the file was loaded
    items = flat.view(element_type(tensor.itemsize))
    view = np.lib.stride_tricks.as_strided(
        items[tensor.storage_offset :],
        shape=tensor.shape,
        strides=tuple(s * tensor.itemsize for s in tensor.stride),
        writeable=False,
    )
    return view
