"""The MTP module parts several families lay out alike, placed under a block's prefix, and
the main model's names, derived from the prefix its decoder lies under.

Most families keep megatron-core's names for what an MTP depth adds around its transformer
layer: ``enorm`` and ``hnorm`` normalise the embedding and the hidden state, ``eh_proj``
projects their concatenation, ``final_layernorm`` closes the depth. Where a family stores
them differs; the names under that place do not.
"""

from __future__ import annotations

from dataclasses import replace

from mtpcheck.families.interface import HfLayout

EH_PARTS = ("enorm.weight", "hnorm.weight", "eh_proj.weight")
"""The two input norms and the projection over their concatenation."""
MODULE_PARTS = (*EH_PARTS, "final_layernorm.weight")
"""megatron-core's ``MultiTokenPredictionLayer`` tensors around its transformer layer."""


def under(prefix: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """``names``, each under ``prefix``."""
    return tuple(prefix + name for name in names)


def megatron_module(block: str) -> HfLayout:
    """An MTP depth laid out as megatron-core's ``MultiTokenPredictionLayer`` under ``block``:
    :data:`MODULE_PARTS` beside the mirrored decoder layer ``block + "transformer_layer."``
    (megatron-core itself, MiniMax); the main-model names are HfLayout's defaults."""
    return HfLayout(
        layer_prefix=block + "transformer_layer.",
        specific=under(block, MODULE_PARTS),
        projection=block + "eh_proj.weight",
    )


def main_model_under(
    layout: HfLayout,
    root: str,
    embed: str = "embed_tokens.weight",
    head: str = "lm_head.weight",
    norm: str = "norm.weight",
) -> HfLayout:
    """``layout`` with the main model's names derived from ``root``, the prefix its decoder
    lies under (``model.``, ``model.language_model.``, ``backbone.``): the embedding
    ``root + embed``, decoder layer ``{k}`` at ``root + "layers.{k}."``, the final norm
    ``root + norm``; the output head ``head`` as given, whole (it usually lies outside
    ``root``). The one place these names are derived from a root."""
    return replace(
        layout,
        main_shared=(root + embed, head),
        main_layer_prefix=root + "layers.{k}.",
        main_norm=root + norm,
    )
