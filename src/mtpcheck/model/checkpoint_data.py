"""The data every opened checkpoint carries, declared once: a frozen dataclass base that the
format readers' checkpoints and the mapped views extend with their own fields and reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from mtpcheck.model.checkpoint import Checkpoint, IntegrityIssue
from mtpcheck.model.tensors import TensorMeta


@dataclass(frozen=True)
class CheckpointData:
    """The :class:`Checkpoint` fields every reader fills alike: where the checkpoint is, its
    config, its tensors and what opening it found. Subclasses add ``format``, ``naming``,
    ``cross_checked``, their own fields and ``read_chunks``."""

    path: str
    config: Mapping[str, Any]
    """Parsed model config (``{}`` when the checkpoint ships none)."""
    config_path: str | None
    tensors: Mapping[str, TensorMeta]
    """Every tensor the checkpoint holds, by its native name."""
    issues: tuple[IntegrityIssue, ...]


_View = TypeVar("_View", bound="ViewData")


@dataclass(frozen=True)
class ViewData(CheckpointData):
    """A checkpoint computed from another one, ``source``, under other names or layouts: what
    opening it checked is what the source's reader checked."""

    format: str
    """The source's format and what it is shown as, e.g. ``hf-safetensors as megatron``."""
    source: Checkpoint

    @classmethod
    def over(
        cls: type[_View],
        source: Checkpoint,
        shown_as: str,
        config: Mapping[str, Any],
        tensors: Mapping[str, TensorMeta],
        **own: Any,
    ) -> _View:
        """``source`` shown as ``shown_as`` (``megatron``, ``hf``, ``gguf``) with ``config``
        and ``tensors``: path, config file and issues are the source's; ``own`` holds the
        subclass's fields."""
        return cls(
            path=source.path,
            config=config,
            config_path=source.config_path,
            tensors=tensors,
            issues=source.issues,
            format=f"{source.format} as {shown_as}",
            source=source,
            **own,
        )

    @property
    def cross_checked(self) -> str:
        """What the source's reader checked when it opened the source."""
        return self.source.cross_checked
