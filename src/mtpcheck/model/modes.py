"""The modes ``accept`` runs in, as enums whose values are the CLI's and the JSON
report's words (each a ``str``, so a report stays byte-identical)."""

from __future__ import annotations

import enum


class _Word(str, enum.Enum):
    """An enum whose ``str()`` and f-string form is its value, on every Python version."""

    def __str__(self) -> str:
        return str(self.value)


class OnlineEngine(_Word):
    """Whose draft-then-verify loop ``accept --online`` runs (``--online-engine``)."""

    MTPCHECK = "mtpcheck"
    """mtpcheck's own loop (:mod:`mtpcheck.accept.online`)."""
    TRANSFORMERS = "transformers"
    """transformers' ``generate(use_mtp=True)``, its counts as transformers reports them."""


class DraftRule(_Word):
    """How ``accept --online`` makes its drafts (``--draft-rule``)."""

    ENGINE = "engine"
    """As vLLM drafts: deeper depths see only the slots they drafted at, layers reused,
    argmax drafts."""
    TRAINING = "training"
    """As megatron-core trains: every depth over every slot, drafts sampled from q."""


class ChainHidden(str, enum.Enum):
    """Which hidden state of MTP depth d a serving engine feeds depth d + 1 (``accept`` with
    several MTP layers)."""

    POST_NORM = "post-norm"
    """The block output after the layer's final norm: megatron-core's
    ``MultiTokenPredictionBlock`` (it trains the chain), transformers' ``MtpModel`` and vLLM's
    MiMo-V2-Flash MTP."""
    PRE_NORM = "pre-norm"
    """The block output before the final norm, which only feeds the output head: vLLM's and
    SGLang's Step-3.5 MTP (``step3p5_mtp.py`` returns the block output, ``compute_logits``
    applies ``shared_head.norm``)."""
