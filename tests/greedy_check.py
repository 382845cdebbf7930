"""A check the draft-then-verify tests share: greedy speculative decoding reproduces the main
model's own greedy continuation, token for token."""

from __future__ import annotations

from typing import Any

import torch

from mtpcheck.accept.head import hidden_and_logits


def assert_main_model_greedy(
    model: Any, prompts: list[list[int]], sequences: list[list[int]]
) -> None:
    """Every token after each prompt is the main model's argmax given the tokens before it."""
    width = max(len(s) for s in sequences)
    padded = [s + [0] * (width - len(s)) for s in sequences]
    _, logits = hidden_and_logits(model, torch.tensor(padded))
    for b, seq in enumerate(sequences):
        greedy = logits[b, : len(seq) - 1].argmax(-1).tolist()
        assert seq[len(prompts[b]) :] == greedy[len(prompts[b]) - 1 :]
