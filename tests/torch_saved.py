"""Checkpoint files loaded the way mtpcheck loads them, turned back into torch objects, so a
test can change them and ``torch.save`` them again (over the same file: the copy holds no
memory map of it)."""

from __future__ import annotations

import argparse
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mtpcheck.dtypes import torch_name
from mtpcheck.formats.safe_pickle import load_torch_file
from mtpcheck.formats.torch_pickle import StoredTensor, TorchDType, TorchName


def as_torch(obj: Any) -> Any:
    """``obj`` with every :class:`StoredTensor` replaced by a torch tensor holding a copy of
    its bytes (containers rebuilt, everything else kept)."""
    if isinstance(obj, StoredTensor):
        elements = np.array(obj.elements())  # a copy: nothing mapped survives
        return torch.from_numpy(elements).view(getattr(torch, torch_name(obj.dtype)))
    if isinstance(obj, (TorchDType, TorchName)):
        return getattr(torch, obj.name)
    if isinstance(obj, argparse.Namespace):
        return argparse.Namespace(**{k: as_torch(v) for k, v in vars(obj).items()})
    if isinstance(obj, OrderedDict):
        return OrderedDict((k, as_torch(v)) for k, v in obj.items())
    if isinstance(obj, dict):
        return {k: as_torch(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(as_torch(v) for v in obj)
    return obj


def load_torch(path: Path) -> Any:
    """:func:`load_torch_file`, with torch tensors."""
    return as_torch(load_torch_file(path))
