"""Checkpoint format readers, selected by sniffing the input path."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from mtpcheck.errors import InputError
from mtpcheck.formats.gguf import GgufReader
from mtpcheck.formats.hf_safetensors import HfSafetensorsReader
from mtpcheck.formats.hub_ref import parse_ref
from mtpcheck.formats.interface import CheckpointReader
from mtpcheck.formats.megatron_dist import MegatronDistReader
from mtpcheck.formats.megatron_legacy import MegatronLegacyReader
from mtpcheck.model import Checkpoint


def readers(trust_pickle: bool = False) -> tuple[CheckpointReader, ...]:
    """Every known reader, in sniffing order; ``trust_pickle`` lifts the unpickling allowlist."""
    return (
        MegatronDistReader(trust_pickle),
        MegatronLegacyReader(trust_pickle),
        GgufReader(),
        HfSafetensorsReader(),
    )


READERS = readers()
"""The readers with the unpickling allowlist in place, in sniffing order."""


@runtime_checkable
class OpensDraft(Protocol):
    """A reader of a format whose MTP layers may be split off into a draft file of their own
    (llama.cpp's ``--mtp``), which opens a target and its draft as one checkpoint."""

    def sniff(self, path: Path) -> bool:
        """Return True when ``path`` looks like this format."""
        ...

    def open_with_draft(self, target: Path, draft: Path) -> Checkpoint:
        """The target and the draft split off from it, as one checkpoint."""
        ...


def open_with_draft(
    target: str | Path, draft: str | Path, trust_pickle: bool = False
) -> Checkpoint:
    """Open ``target`` and its split-off ``draft`` with the first draft-aware reader that
    recognises the target (the last one, which explains what it needs, when none does)."""
    candidates = [r for r in readers(trust_pickle) if isinstance(r, OpensDraft)]
    chosen = next((r for r in candidates if r.sniff(Path(target))), candidates[-1])
    return chosen.open_with_draft(Path(target), Path(draft))


def open_checkpoint(path: str | Path, trust_pickle: bool = False) -> Checkpoint:
    """Open ``path`` with the first reader that recognises it."""
    p = Path(path)
    if not p.exists():
        reason = "broken symlink or symlink loop" if p.is_symlink() else "no such file or directory"
        raise InputError(p, reason)
    candidates = readers(trust_pickle)
    for reader in candidates:
        if reader.sniff(p):
            return reader.open(p)
    # No reader recognises it: the default (last, HF) reader explains what it looked for.
    return candidates[-1].open(p)


def open_input(
    arg: str,
    trust_pickle: bool = False,
    fetch_bytes: bool = False,
    log: Callable[[str], None] = lambda _: None,
    draft: str | None = None,
) -> Checkpoint:
    """A local path, or a Hub repository (``hf://ORG/NAME[@REV]``, or a bare ``ORG/NAME`` that
    names no local path) read by its headers; ``fetch_bytes`` lets a Hub repository's tensor
    bytes be read by range. With ``draft``: a local target and the draft file split off from
    it, opened as one checkpoint."""
    if draft is not None:
        return open_with_draft(arg, draft, trust_pickle)
    ref = parse_ref(arg)
    if ref is not None:
        from mtpcheck.formats.hub import open_hub  # no HTTP stack for local paths

        return open_hub(ref, fetch_bytes, log)
    return open_checkpoint(arg, trust_pickle)


__all__ = [
    "READERS",
    "CheckpointReader",
    "OpensDraft",
    "open_checkpoint",
    "open_input",
    "open_with_draft",
    "readers",
]
