"""mtpcheck's errors cross process boundaries intact.

torch.distributed's object collectives (``all_gather_object``, ``broadcast_object_list``: the
torchrun ranks, and megatron-core's save, which gathers its workers' exceptions) move them by
pickle. An error rebuilt from its message instead of its fields would fail to unpickle, and
the user would see ``TypeError ... missing 1 required positional argument`` (exit 3) instead
of the file and the reason.
"""

from __future__ import annotations

import importlib
import pickle
import pkgutil

import pytest

import mtpcheck
from mtpcheck.errors import DamagedInput, InputError, MtpcheckError, PathError


def _all_error_classes() -> list[type[MtpcheckError]]:
    for module in pkgutil.walk_packages(mtpcheck.__path__, "mtpcheck."):
        if not module.name.endswith("__main__"):  # it runs the CLI
            importlib.import_module(module.name)
    found: list[type[MtpcheckError]] = []
    pending: list[type[MtpcheckError]] = [MtpcheckError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda c: c.__qualname__)


def _example(cls: type[MtpcheckError]) -> MtpcheckError:
    if issubclass(cls, PathError):
        return cls("/ckpt/model-00002-of-00002.safetensors", "file is 0 bytes,\nline two")
    return cls("a reason with a line\nbreak")


def test_every_error_class_is_found() -> None:
    names = {c.__name__ for c in _all_error_classes()}
    assert {"MtpcheckError", "InputError", "HeaderError", "ConfigError", "DamagedInput"} <= names
    assert "MappingError" in names


@pytest.mark.parametrize("cls", _all_error_classes(), ids=lambda c: c.__name__)
def test_pickles_and_unpickles_intact(cls: type[MtpcheckError]) -> None:
    error = _example(cls)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert str(back) == str(error)
    if isinstance(error, PathError):
        assert isinstance(back, PathError)
        assert (back.path, back.reason) == (error.path, error.reason)
        assert "\n" not in str(back)  # still one line


def test_an_input_error_survives_torch_distributed_all_gather_object() -> None:
    """The collective that turned a truncated source into exit 3 inside megatron-core's save."""
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sent = [InputError("/x/model.safetensors", "truncated"), DamagedInput("/x", "lost MTP")]
        out: list[object] = [None]
        dist.all_gather_object(out, sent)
    finally:
        if created:
            dist.destroy_process_group()
    (received,) = out
    assert [type(e) for e in received] == [InputError, DamagedInput]
    assert [str(e) for e in received] == [str(e) for e in sent]
