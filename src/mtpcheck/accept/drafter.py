"""A separate drafter (EAGLE-3, DFlash, ...) that speculative decoding drafts with, as
``accept --drafter DIR`` names it: its kind, recognised from its config and tensor names by
the drafter registry (:mod:`mtpcheck.families.drafters`), and the ``method`` vLLM's
``--speculative-config`` takes for that kind.

A running server does not say which drafter or method it was started with (vLLM's
``/metrics`` and ``/v1/models`` name neither), so ``accept --server`` can only name what the
user says the server runs; ``accept --engine vllm`` starts vLLM with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtpcheck.errors import InputError


@dataclass(frozen=True)
class Drafter:
    """A drafter folder, its kind and the method vLLM serves it with."""

    path: Path
    kind: str
    """The registry's key, e.g. ``eagle3-speculators``."""
    display: str
    """The kind in words, e.g. ``EAGLE-3 (speculators format)``."""
    method: str
    """vLLM's ``speculative_config["method"]``, e.g. ``eagle3``."""
    speculative_tokens: int | None = None
    """The drafts a step its config proposes (speculators' default proposal method), if any."""

    @property
    def title(self) -> str:
        """How reports name what is measured: ``EAGLE-3 (speculators format) drafter
        (eagle3)``."""
        return f"{self.display} drafter ({self.method})"

    def speculative_config(self, k: int) -> dict[str, Any]:
        """vLLM's ``speculative_config`` drafting ``k`` tokens a step with this drafter."""
        from mtpcheck.families.drafters import vllm_speculative_config

        return vllm_speculative_config(self.method, str(self.path), k)

    def details(self) -> dict[str, str]:
        """What a report's finding says of it."""
        return {"drafter": str(self.path), "kind": self.kind, "method": self.method}

    def described(self) -> str:
        """One line: the folder, its kind and vLLM's method."""
        return (
            f"drafter {self.path}: {self.display}, which vLLM drafts with as method {self.method!r}"
        )


def identify_drafter(path: Path, trust_pickle: bool = False) -> Drafter:
    """The drafter at ``path``; an :class:`InputError` where it is not a drafter the registry
    knows, or one no vLLM method serves."""
    from mtpcheck.families.drafters import draft_tokens, recognise, unknown_drafter
    from mtpcheck.formats import open_checkpoint

    checkpoint = open_checkpoint(path, trust_pickle)
    kind = recognise(checkpoint.config, checkpoint.tensors)
    if kind is None:
        seen = unknown_drafter(checkpoint.config)
        raise InputError(
            path,
            f"a drafter of a kind mtpcheck does not know ({seen})"
            if seen
            else "not a separate drafter (its config and tensors are no drafter kind mtpcheck "
            "knows: EAGLE, EAGLE-3, DFlash, ...)",
        )
    if not kind.engines.vllm:
        raise InputError(
            path,
            f"{kind.display}: vLLM has no speculative method that drafts with it as a separate "
            "model" + (f" ({kind.engines.other})" if kind.engines.other else ""),
        )
    return Drafter(
        Path(path),
        kind.key,
        kind.display,
        kind.engines.vllm,
        draft_tokens(checkpoint.config),
    )
