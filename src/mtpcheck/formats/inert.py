"""What the restricted unpicklers hand a pickle: objects the file cannot change.

Unpickling calls what a file names, and then applies state to what it built: pickle's
``BUILD`` opcode calls ``__setstate__`` or sets attributes, on whatever object is on its stack,
a class or a shared object included. A class changed that way stays changed for the rest of the
process, so one file would decide how every later file is read. Every global the unpicklers of
:mod:`mtpcheck.formats.safe_pickle` resolve is therefore one of:

* a builtin type, whose attributes no one can set (``dict``, ``tuple``, ``OrderedDict``, ...);
* an :class:`InertCall`: a callable whose attributes cannot be set and which takes no state;
* a class of metaclass :class:`Frozen`, made for one load (:class:`LoadScope`): a file fills in
  its instances, never the class, and the next file gets classes of its own;
* a :class:`Sealed` value (a dtype, a storage type): one that was filled in once, at its
  making, and refuses state after.

Each refusal is a :class:`RefusedChange`, which the loaders turn into one line naming the file.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mtpcheck.errors import RefusedInput, shown


class RefusedChange(RefusedInput):
    """A pickle tried to change an object mtpcheck handed it, or called one wrongly."""


ON_CLASS: Any = object()
"""The default of a stand-in's ``__setstate__`` state: pickle's BUILD on the stand-in's class
calls the class's ``__setstate__`` with the state alone, which then lands in ``self``."""


class Frozen(type):
    """Metaclass of the classes an unpickler hands out: a file cannot set, or delete, their
    attributes (``BUILD`` on a class sets them with ``setattr``)."""

    def __setattr__(cls, name: str, value: Any) -> None:
        raise RefusedChange(f"the pickle sets {name} on the class {cls.__qualname__}")

    def __delattr__(cls, name: str) -> None:
        raise RefusedChange(f"the pickle deletes {name} of the class {cls.__qualname__}")


class InertCall:
    """A function a pickle may call, and nothing else: no attribute of it can be set (a
    function's ``__defaults__`` could be), and it takes no state."""

    __slots__ = ("_call", "_name")
    _call: Callable[..., Any]
    _name: str

    def __init__(self, name: str, call: Callable[..., Any]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_call", call)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self._call(*args, **kwargs)
        except TypeError as e:
            if e.__traceback__ is not None and e.__traceback__.tb_next is None:  # the call
                raise RefusedChange(f"{self._name} called with {shown(args)}") from e
            raise

    def __setattr__(self, name: str, value: Any) -> None:
        raise RefusedChange(f"the pickle sets {name} on {self._name}")

    def __delattr__(self, name: str) -> None:
        raise RefusedChange(f"the pickle deletes {name} of {self._name}")

    def __setstate__(self, state: Any) -> None:
        raise RefusedChange(f"the pickle changes {self._name}")

    def __repr__(self) -> str:
        return f"<{self._name}>"


class Sealed:
    """Mixin of the frozen values an unpickler hands out as they are (a dtype, a storage
    type): state is taken only by an instance still empty, as one that ``pickle`` itself makes
    from a class (mtpcheck's own objects crossing processes); a made one refuses it."""

    def __setstate__(self, state: Any) -> None:
        if vars(self) or not isinstance(state, dict):
            raise RefusedChange(f"the pickle changes {type(self).__name__} {self!s}")
        for key, value in state.items():
            object.__setattr__(self, key, value)


class LoadScope:
    """The classes one load makes (:class:`Frozen`, named after what they stand for), at most
    ``limit`` of them: a file naming ever new classes is refused rather than grown without
    bound, and no class outlives the load or is shared with another file."""

    def __init__(self, limit: int = 10_000) -> None:
        self.limit = limit
        self._made: dict[tuple[str, type], type] = {}

    def frozen(self, qualified_name: str, base: type, body: dict[str, Any] | None = None) -> type:
        """This load's class standing for ``qualified_name``, derived from ``base``."""
        key = (qualified_name, base)
        made = self._made.get(key)
        if made is None:
            if len(self._made) >= self.limit:
                raise RefusedChange(f"the pickle names more than {self.limit} classes")
            short = qualified_name.rsplit(".", 1)[-1]
            namespace = {"_qualified_name": qualified_name, **(body or {})}
            made = Frozen(short, (base,), namespace)
            self._made[key] = made
        return made
