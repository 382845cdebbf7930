"""What a draft-then-verify loop produced: the sequences, and each verify pass's drafts."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Draft:
    """One verify pass of a decoding loop: where it drafted and what it accepted."""

    sequence: int
    slot: int
    """Teacher-forced slot t: depth 1 used h_t and x_{t+1} to propose x_{t+2} (depth j
    proposed x_{t+j+1})."""
    depth_accepted: int
    """Drafts accepted in this verify pass (the leading ones, 0..k)."""
    alphas: tuple[float, ...]
    """Per depth, up to the first rejected one: sum_v min(p(v), q(v)) at the verify step
    (sampling) or the greedy hit."""

    @property
    def accepted(self) -> bool:
        """Depth 1's draft was accepted."""
        return self.depth_accepted >= 1

    @property
    def alpha(self) -> float:
        """Depth 1's alpha (or greedy hit)."""
        return self.alphas[0]


@dataclass
class Decoded:
    """The sequences a decoding loop extended (prompts included) and its verify passes."""

    sequences: list[list[int]]
    drafts: list[Draft] = field(default_factory=list)
    k: int = 1

    def online_rate(self) -> float:
        """The share of verify passes whose depth-1 draft was accepted."""
        return sum(d.accepted for d in self.drafts) / len(self.drafts)
