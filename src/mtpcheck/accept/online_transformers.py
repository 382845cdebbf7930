"""``accept --online --online-engine transformers``: transformers' own MTP speculative decoding.

``model.generate(..., use_mtp=True)`` runs transformers' ``MTPCandidateGenerator``: its
``MtpModel`` loads the checkpoint's MTP layers itself, drafts ``num_mtp_layers`` tokens a step
and the main model verifies them. What it reports is what its generator is told each step
(``update_candidate_strategy(..., num_matches)``); the drafts and those counts are recorded
here, so the report shows transformers' own figure next to the teacher-forced one at the same
positions, which is what users compare with their serving engine.

transformers finds the MTP tensors through the model class's ``_keys_to_ignore_on_load_unexpected``
patterns, which name the released depth (DeepSeek-V3: ``model.layers.61``); the checkpoint's
own MTP layer prefixes are added to the instance's patterns so a checkpoint with another depth
(a smaller model, the fixtures) loads its own layers.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mtpcheck.accept.hf_quiet import quiet_transformers
from mtpcheck.errors import MtpcheckError, raised_by_us


@dataclass
class Step:
    """One drafting step of transformers' MTP candidate generator."""

    sequence: int
    position: int
    """Length of the input when drafting: the first draft proposes the token at this index."""
    drafts: tuple[int, ...]
    counted: int = -1
    """Drafts transformers counted as accepted (``num_matches``)."""


@dataclass
class Generated:
    """What ``generate(use_mtp=True)`` produced, and its drafting steps."""

    sequences: list[list[int]]
    steps: list[Step] = field(default_factory=list)
    k: int = 1


@contextlib.contextmanager
def _recording(steps: list[Step], sequence: int) -> Iterator[None]:
    """Record each drafting step of ``MTPCandidateGenerator`` (the class is patched only
    inside this block)."""
    from transformers.generation.candidate_generator import MTPCandidateGenerator as generator

    get, update = generator.get_candidates, generator.update_candidate_strategy

    def get_candidates(self: Any, input_ids: Any, **kwargs: Any) -> Any:
        candidates, logits = get(self, input_ids, **kwargs)
        position = input_ids.shape[1]
        if candidates.shape[1] > position:
            drafts = tuple(int(t) for t in candidates[0, position:])
            steps.append(Step(sequence, position, drafts))
        return candidates, logits

    def update_candidate_strategy(self: Any, input_ids: Any, scores: Any, num_matches: Any) -> Any:
        if steps and steps[-1].counted < 0:
            steps[-1].counted = int(num_matches)
        return update(self, input_ids, scores, num_matches)

    generator.get_candidates = get_candidates  # type: ignore[method-assign,assignment,unused-ignore]
    generator.update_candidate_strategy = update_candidate_strategy  # type: ignore[method-assign]
    try:
        yield
    finally:
        generator.get_candidates = get  # type: ignore[method-assign]
        generator.update_candidate_strategy = update  # type: ignore[method-assign]


def point_at_layers(model: Any, prefixes: Sequence[str]) -> None:
    """Let transformers' MTP loader find MTP layers under ``prefixes`` too."""
    own = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    ours = [re.escape(p) + ".*" for p in prefixes]
    model._keys_to_ignore_on_load_unexpected = [*own, *(p for p in ours if p not in own)]


@torch.no_grad()
def transformers_decode(
    model: Any,
    prefixes: Sequence[str],
    prompts: list[list[int]],
    new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> Generated:
    """``new_tokens`` after each prompt through ``model.generate(use_mtp=True)``, one prompt
    at a time (transformers' assisted decoding takes a batch of one)."""
    point_at_layers(model, prefixes)
    out = Generated([])
    sampling: dict[str, Any] = (
        {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    )
    device = next(model.parameters()).device
    for index, prompt in enumerate(prompts):
        torch.manual_seed(seed + index)
        with _recording(out.steps, index), quiet_transformers():
            try:
                ids = torch.tensor([prompt], device=device)
                generated = model.generate(ids, max_new_tokens=new_tokens, use_mtp=True, **sampling)
            except Exception as e:  # transformers raises many types for what it cannot run
                if raised_by_us(e):  # a bug of mtpcheck's own, not the library's refusal
                    raise
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise MtpcheckError(
                    f"transformers cannot run MTP decoding on this checkpoint: {first} "
                    "(use --online-engine mtpcheck)"
                ) from e
        out.sequences.append(generated[0].tolist())
    config = model.config.get_text_config()
    out.k = int(getattr(config, "num_mtp_layers", 1) or 1)
    return out
