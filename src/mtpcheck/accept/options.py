"""What one ``mtpcheck accept`` run is asked to do."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AcceptOptions:
    checkpoint: Path
    workloads: tuple[tuple[str, Path], ...]
    compare: Path | None = None
    temperature: float = 1.0
    device: str = "cpu"
    """Where the MTP layers run (and the main model, without ``device_map``)."""
    device_map: str | None = None
    """accelerate's placement of the main model: a strategy name or a JSON map file."""
    dtype: str = "auto"
    max_tokens: int = 512
    tokenizer: Path | None = None
    min_acceptance: float | None = None
    trust_pickle: bool = False
    online: bool = False
    """Also run real draft-then-verify decoding (``accept --online``)."""
    prompt_tokens: int = 9
    new_tokens: int = 40
    online_engine: str = "mtpcheck"
    """``mtpcheck`` (this package's loop) or ``transformers`` (``generate(use_mtp=True)``)."""
    depths: int | None = None
    """Chain at most this many MTP layers (k); all the checkpoint holds by default."""
    draft_rule: str = "training"
    """How --online drafts depth 2 and deeper: ``training`` (every depth over every slot, as
    megatron-core trains) or ``engine`` (vLLM's rule: :mod:`mtpcheck.accept.engine_rule`)."""
    chain: str | None = None
    """Override the family's rule for what depth d passes to depth d+1 (a
    :class:`ChainHidden` value: ``post-norm`` or ``pre-norm``)."""
