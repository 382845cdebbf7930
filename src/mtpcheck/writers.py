"""Tools known to write checkpoints without their MTP layer, as data: how their output is
recognised and what they do, so that an audit names the tool's behaviour, not only the loss."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass


@dataclass(frozen=True)
class Writer:
    """A tool whose output is recognised from what it records in the checkpoint."""

    name: str
    metadata_format: str
    """The ``format`` it writes into each safetensors header's ``__metadata__``."""
    mtp: str
    """What it does to the MTP layer, in words that follow the tool's name."""


WRITERS: tuple[Writer, ...] = (
    Writer(
        "mlx-lm",
        "mlx",
        "drops the MTP layer of every model it converts (each model's sanitize() removes the "
        "layers past num_hidden_layers; DeepSeek-V3's removes only model.layers.61 and refuses "
        "any other) while config.json keeps the count key: this checkpoint has no drafter; "
        "serve the original for MTP speculative decoding, or set the count key to 0",
    ),
)
"""Checked against mlx-lm 0.32.2's own conversions (tests/thirdparty/mlx, NOTES.md there)."""


def writer_of(written_as: Collection[str]) -> Writer | None:
    """The known writer whose metadata ``format`` the checkpoint's shards record."""
    return next((w for w in WRITERS if w.metadata_format in written_as), None)
