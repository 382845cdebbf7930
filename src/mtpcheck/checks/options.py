"""What ``inspect`` and ``diff`` are asked to do: their options declared once, here (the CLI's
parameters and the API's keywords both come from these fields)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpcheck.declared import argument, check_fields, internal, option, silent
from mtpcheck.layouts import MegatronLayout


def fetch_option() -> Any:
    """``--fetch``, as ``inspect`` and ``diff`` both take it."""
    return option(
        False,
        "For hf:// inputs: read the tensor bytes a check needs by HTTP range (shared copies "
        "in inspect; the compared tensors in diff). Without it only headers are fetched.",
        bool,
    )


def megatron_layout_option() -> Any:
    """``--megatron-layout``, as ``diff`` and ``roundtrip`` both take it."""
    return option(
        MegatronLayout.MEGATRON_CORE,
        "Whose modules the Megatron checkpoint is saved from: megatron-core's "
        "(Megatron-Bridge, Megatron-LM, mbridge, the built-in converter) or mcore-bridge's "
        "(ms-swift 4), which lay out the gated delta net and gated attention of Qwen3-Next / "
        "3.5 their own way.",
        choices=MegatronLayout,
    )


@dataclass(frozen=True)
class InspectOptions:
    """One ``inspect``: the checkpoint, and what is audited with it."""

    path: str | Path = argument(
        "A local checkpoint, or a Hub repository (hf://ORG/NAME[@REVISION]) read by its headers."
    )
    fetch: bool = fetch_option()
    draft: str | Path | None = option(
        None,
        "For a GGUF target written without its nextn layer (llama.cpp's --no-mtp): the MTP "
        "draft file split off from it (--mtp, mtp-NAME.gguf); the two are audited as one model.",
        metavar="DRAFT",
    )
    target: str | Path | None = option(
        None,
        "For a drafter that ships beside its model (EAGLE-3, DFlash, an exported MTP layer): "
        "the model it is served with, local or hf://; the pair is checked together.",
        metavar="TARGET",
    )
    trust_pickle: bool = internal(False)
    """Unpickle Megatron files without the allowlist (the CLI's ``--trust-pickle``)."""
    log: Callable[[str], None] = internal(silent)
    """Where progress lines go (the CLI: stderr); dropped by default."""

    def validate(self) -> None:
        """Each value within its declared choices."""
        check_fields(self)


@dataclass(frozen=True)
class DiffOptions:
    """One ``diff``: the two checkpoints, and what of them is compared how."""

    a: str | Path = argument("The reference checkpoint (local or hf://).")
    b: str | Path = argument("The checkpoint compared against A (local or hf://).")
    all_tensors: bool = option(
        False, "Compare every tensor, not only the MTP scope.", bool, flag="--all"
    )
    dequantize: bool = option(
        False,
        "Dequantize tensors one side stores quantized and measure them against the other "
        "side's full-precision values, in quantization steps (FP8, INT8, packed INTn, NVFP4; "
        "GGUF Q8_0, Q4_K, Q6_K).",
        bool,
    )
    fetch: bool = fetch_option()
    megatron_layout: MegatronLayout = megatron_layout_option()
    trust_pickle: bool = internal(False)
    """Unpickle Megatron files without the allowlist (the CLI's ``--trust-pickle``)."""
    log: Callable[[str], None] = internal(silent)
    """Where progress lines go (the CLI: stderr); dropped by default."""

    def validate(self) -> None:
        """Each value within its declared choices."""
        check_fields(self)
