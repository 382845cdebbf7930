"""Writing a checkpoint so that a failure leaves nothing behind.

A converter writes into a hidden folder beside the destination, renamed onto it only once
everything is written; on any failure, Ctrl-C or SIGTERM included, the folder (and any parent
folder made for it) is removed, so a refused or failed conversion never leaves a partial
checkpoint that a rerun would refuse as "not empty" or a later step could mistake for a whole
one.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from mtpcheck.convert.builtin import require_empty_destination
from mtpcheck.errors import InputError

PARTIAL = ".partial-"
"""Infix of the hidden folder a conversion writes into (``.DST.partial-XXXX``)."""


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """CI cancels jobs with SIGTERM: treat it like Ctrl-C so temporary files go."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _missing_parents(dst: Path) -> list[Path]:
    """The folders above ``dst`` that do not exist yet, nearest last."""
    missing = []
    parent = dst.absolute().parent
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    return missing[::-1]


def _default_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the file system allows it)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def fresh_output(dst: Path) -> Iterator[Path]:
    """A hidden folder beside ``dst`` to write into, renamed to ``dst`` when the block ends
    normally; removed, with the parents made for it, when it raises or is interrupted."""
    require_empty_destination(dst)
    made = _missing_parents(dst)
    try:
        dst.absolute().parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(dst, f"cannot create the destination's folder ({e.strerror or e})") from e
    try:
        partial = Path(tempfile.mkdtemp(prefix=f".{dst.name}{PARTIAL}", dir=dst.absolute().parent))
    except OSError as e:
        _remove_made(made)
        raise InputError(dst, f"cannot write beside the destination ({e.strerror or e})") from e
    done = False
    try:
        with sigterm_as_interrupt():
            os.chmod(partial, _default_mode())  # mkdtemp's 0700 is not what a user expects
            yield partial
            try:
                os.rename(partial, dst)  # onto an empty folder too (POSIX rename)
            except OSError as e:
                raise InputError(dst, f"cannot move the written checkpoint here ({e})") from e
            done = True
            _sync_folder(dst.absolute().parent)
    finally:
        if not done:
            shutil.rmtree(partial, ignore_errors=True)
            _remove_made(made)


def _remove_made(made: list[Path]) -> None:
    """Remove the folders made for a destination, nearest first, while they are empty."""
    for folder in reversed(made):
        if not folder.is_dir() or any(folder.iterdir()):
            return
        folder.rmdir()
