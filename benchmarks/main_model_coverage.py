"""How much of a main model's loss ``main-model`` finds: each shipped fixture with one of its
main-model tensors taken out, one tensor at a time, for every tensor; and with one tensor name
taken out of every main layer holding it, for every name (what a converter that never writes
one kind of tensor does). Names and headers only: the check reads no bytes. Prints, per
fixture, the losses found (the finding names the tensor, its layer or the name) against those
tried, whether the family is held to a definition, and the losses that went unseen.

    python benchmarks/main_model_coverage.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpcheck.families import analyse  # noqa: E402
from mtpcheck.families.definitions import definition_of  # noqa: E402
from mtpcheck.formats import open_checkpoint  # noqa: E402
from tests.main_model_losses import (  # noqa: E402
    every_layer_losses,
    loss_is_named,
    losses_are_named,
    main_tensors,
)


def coverage(root: Path) -> tuple[str, int, list[str], int, list[str]]:
    """(family, single losses tried, those not found, every-layer losses tried, those not
    found)."""
    ckpt = open_checkpoint(root)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    assert analysis.family is not None
    top, layers = main_tensors(ckpt, analysis)
    tried = [*top, *layers]
    missed = [n for n in tried if not loss_is_named(ckpt, analysis, n)]
    every = every_layer_losses(ckpt, analysis)
    unseen = [rel for rel, lost in every if not losses_are_named(ckpt, analysis, lost, rel)]
    return analysis.family.key, len(tried), missed, len(every), unseen


def main() -> int:
    totals = [0, 0, 0, 0]
    for config in sorted((ROOT / "fixtures").glob("*/config.json")):
        family, tried, missed, every, unseen = coverage(config.parent)
        totals = [
            a + b
            for a, b in zip(
                totals, [tried - len(missed), tried, every - len(unseen), every], strict=True
            )
        ]
        held = "definition" if definition_of(family) else "peers only"
        print(
            f"{config.parent.name:18s} {held:11s} single {tried - len(missed):4d} of {tried:4d}"
            f"  every layer {every - len(unseen):3d} of {every:3d}",
            end="  ",
        )
        shown = [*missed[:2], *unseen[:2]]
        print(f"unseen: {', '.join(shown)}{' ...' if len(missed) + len(unseen) > 4 else ''}")
    found, total, found_every, total_every = totals
    print(
        f"all fixtures: {found} of {total} single-tensor losses found ({found / total:.0%}); "
        f"{found_every} of {total_every} every-layer losses ({found_every / total_every:.0%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
