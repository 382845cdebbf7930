"""How much of a main model's loss ``main-model`` finds: each shipped fixture with one of its
main-model tensors taken out, one tensor at a time, for every tensor (names and headers only:
the check reads no bytes). Prints, per fixture, the losses found (the finding names the tensor
or its layer) against those tried, and the tensors whose loss went unseen.

    python benchmarks/main_model_coverage.py
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mtpcheck.families import analyse  # noqa: E402
from mtpcheck.formats import open_checkpoint  # noqa: E402
from tests.main_model_losses import loss_is_named, main_tensors  # noqa: E402


def coverage(root: Path) -> tuple[int, list[str]]:
    """(tensors tried, the ones whose loss was not found)."""
    ckpt = open_checkpoint(root)
    analysis = analyse(ckpt.config, ckpt.tensors, ckpt.config_path)
    top, layers = main_tensors(ckpt, analysis)
    tried = [*top, *layers]
    return len(tried), [n for n in tried if not loss_is_named(ckpt, analysis, n)]


def main() -> int:
    found = total = 0
    for config in sorted((ROOT / "fixtures").glob("*/config.json")):
        tried, missed = coverage(config.parent)
        total += tried
        found += tried - len(missed)
        print(f"{config.parent.name:20s} {tried - len(missed):4d} of {tried:4d}", end="  ")
        print(f"unseen: {', '.join(missed[:3])}{' ...' if len(missed) > 3 else ''}")
    print(f"all fixtures: {found} of {total} single-tensor losses found ({found / total:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
