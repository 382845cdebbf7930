"""How the offline decoding loops choose tokens: argmax at T = 0, else a draw from the
tempered distribution, every random number from one seeded generator in decoding order (so a
run repeats exactly)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mtpcheck.accept.metrics import distributions


@dataclass(frozen=True)
class TokenSampler:
    """Token choice at ``temperature`` from the generator ``gen``."""

    temperature: float
    gen: torch.Generator

    @classmethod
    def seeded(cls, temperature: float, seed: int) -> TokenSampler:
        """A sampler whose generator starts from ``seed``."""
        return cls(temperature, torch.Generator().manual_seed(seed))

    def draw(self, probs: torch.Tensor) -> int:
        """One token drawn from ``probs``."""
        return int(torch.multinomial(probs, 1, generator=self.gen))

    def pick(self, logits: torch.Tensor) -> int:
        """The token at ``logits``: their argmax (T = 0) or drawn from ``p_T``."""
        if self.temperature == 0:
            return int(logits.argmax())
        return self.draw(distributions(logits, self.temperature))

    def uniform(self) -> float:
        """A uniform draw in [0, 1), for an accept-or-reject test."""
        return float(torch.rand((), generator=self.gen, dtype=torch.float64))
