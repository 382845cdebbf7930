"""Where the raw bytes of a ``torch.save``-d tensor lie, found without loading the tensor.

Each tensor chunk of a torch.distributed.checkpoint ``.distcp`` file is a ``torch.save``
archive at a byte range (:mod:`mtpcheck.formats.torch_save_file`). For a plain contiguous
tensor stored uncompressed, its elements are the tensor in C order at a fixed offset of the
file, so they can be read by offset in bounded chunks, with no intermediate blob and no second
copy. :func:`locate_tensor` reads only the zip directory, the record's local header and the
small pickle (through :mod:`mtpcheck.formats.safe_pickle`'s allowlist); anything else (a
compressed record, another pickle, a strided view) gives ``None``, and the caller assembles the
tensor from its elements instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtpcheck.errors import InputError
from mtpcheck.formats.torch_pickle import StoredTensor, TorchReadError
from mtpcheck.formats.torch_save_file import Archive

MAX_PICKLE_BYTES = 64 * 1024
"""A tensor's ``data.pkl`` is ~160 bytes; anything much larger is not a plain tensor."""


@dataclass(frozen=True)
class RawTensor:
    """A tensor's bytes in C order: ``nbytes`` at ``offset`` of the file."""

    dtype: str
    """safetensors dtype name."""
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def locate_tensor(fd: int, start: int, length: int) -> RawTensor | None:
    """The tensor ``torch.save``-d at bytes ``start..start+length`` of ``fd``, by offset;
    None when it is not a plain contiguous tensor record stored uncompressed."""
    from mtpcheck.formats.safe_pickle import unpickle_archive

    try:
        archive = Archive(f"<fd {fd}>", (start, length), fd=fd)
    except (TorchReadError, OSError, ValueError):
        return None
    try:
        tensor = unpickle_archive(archive, archive.path, max_bytes=MAX_PICKLE_BYTES)
        if not isinstance(tensor, StoredTensor) or not tensor.is_c_contiguous():
            return None
        at = archive.offset(tensor.storage.key)
        if at is None:
            return None
        offset = at + tensor.storage_offset * tensor.itemsize
        nbytes = tensor.numel * tensor.itemsize
        if offset + nbytes > start + length:
            return None
        return RawTensor(tensor.dtype, tensor.shape, offset, nbytes)
    except (InputError, TorchReadError, OSError):
        return None  # not plain, or malformed: reading its elements words any error
    finally:
        archive.close()
