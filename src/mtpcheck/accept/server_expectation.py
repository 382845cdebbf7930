"""What a served checkpoint should accept: its own drafter, offline, on the very prompts sent
to the server, decoded by the engine's draft rule (``accept --online``'s rule, the one vLLM
uses) with the server's k, temperature and new tokens. A server below it loses acceptance
the checkpoint has; a server at it with a low figure has a drafter that earns little."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from mtpcheck.accept.options import AcceptOptions
from mtpcheck.accept.server_requests import Prompt
from mtpcheck.accept.stats import ratio_share
from mtpcheck.errors import MtpcheckError
from mtpcheck.model import CheckpointSummary, ServerAcceptance, Share


def expectations(
    options: AcceptOptions,
    prompts: Sequence[Sequence[Prompt]],
    figures: Sequence[ServerAcceptance],
    log: Callable[[str], None],
) -> tuple[list[tuple[Share, ...]], CheckpointSummary]:
    """Per workload, the offline share at each position the server reported (empty where
    the server gave no positions)."""
    from mtpcheck.accept.engine_rule import engine_decode
    from mtpcheck.accept.head import drafter_layouts
    from mtpcheck.accept.loading import load_drafter, resolve_device
    from mtpcheck.families import FAMILY_BY_NAME, analyse, summarise
    from mtpcheck.formats import open_checkpoint

    assert options.checkpoint is not None
    ckpt = open_checkpoint(options.checkpoint, options.trust_pickle)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    layout = drafter_layouts(ckpt, analysis)
    if isinstance(layout, str):
        raise MtpcheckError(f"{ckpt.path}: no drafter to expect figures from ({layout})")
    drafter = load_drafter(ckpt, layout, resolve_device(options.device), options.dtype, None,
                           None)  # fmt: skip
    family = FAMILY_BY_NAME[drafter.family]
    out: list[tuple[Share, ...]] = []
    for batch, figure in zip(prompts, figures, strict=True):
        if not figure.by_position or figure.k is None:
            out.append(())
            continue
        decoded = engine_decode(
            drafter,
            [list(cast(list[int], p)) for p in batch],  # token ids with CKPT
            options.new_tokens,
            figure.k,
            family.serving.first_state,
            family.serving.zeroes_position0,
            bool(family.layout.copies),
            options.temperature,
        )
        steps = [0] * len(batch)
        reached = [[0] * len(batch) for _ in range(figure.k)]
        for d in decoded.drafts:
            steps[d.sequence] += 1
            for i in range(min(d.depth_accepted, figure.k)):
                reached[i][d.sequence] += 1
        out.append(tuple(ratio_share(r, steps) for r in reached))
        log(f"{figure.workload}: offline by vLLM's draft rule "
            + " / ".join(f"{s.estimate.value:.3f}" for s in out[-1]))  # fmt: skip
    return out, summarise(ckpt, analysis)
