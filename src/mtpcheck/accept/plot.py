"""``--plot``: a PNG bar chart of acceptance per workload (and per checkpoint)."""

from __future__ import annotations

from pathlib import Path

from mtpcheck.errors import InputError, MtpcheckError
from mtpcheck.model import AcceptanceResult, Report


def _label(path: str, index: int, count: int) -> str:
    name = Path(path).name or path
    return f"{'AB'[index]}: {name}" if count == 2 else name


def write_plot(report: Report, path: Path) -> None:
    """Bars: alpha with its 95 % interval; dots: greedy acceptance. One group per workload."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - matplotlib is a dependency
        raise MtpcheckError(f"--plot needs matplotlib: {e}") from e

    results = report.acceptance
    workloads = list(dict.fromkeys(r.workload for r in results))
    checkpoints = list(dict.fromkeys(r.checkpoint for r in results))
    by_key: dict[tuple[str, str], AcceptanceResult] = {
        (r.checkpoint, r.workload): r for r in results
    }
    width = 0.8 / max(1, len(checkpoints))
    colours = ("#4C72B0", "#DD8452")
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(workloads) + 1.5), 3.2), dpi=100)
    for c, checkpoint in enumerate(checkpoints):
        xs, alphas, lows, highs, greedy = [], [], [], [], []
        for w, workload in enumerate(workloads):
            r = by_key[(checkpoint, workload)]
            xs.append(w + (c - (len(checkpoints) - 1) / 2) * width)
            alpha = r.alpha.value
            alphas.append(alpha)
            lows.append(alpha - (r.alpha.low if r.alpha.low is not None else alpha))
            highs.append((r.alpha.high if r.alpha.high is not None else alpha) - alpha)
            greedy.append(r.greedy.value)
        label = _label(checkpoint, c, len(checkpoints))
        ax.bar(
            xs,
            alphas,
            width * 0.9,
            yerr=[lows, highs],
            capsize=3,
            color=colours[c % 2],
            label=f"{label}: α",
        )
        ax.scatter(xs, greedy, color="black", marker="D", s=14, zorder=3)
        for x, r in zip(xs, (by_key[(checkpoint, w)] for w in workloads), strict=True):
            if r.drafter:
                alpha = r.alpha.value
                ax.text(x, alpha / 2, f"{alpha:.2f}", ha="center", color="white", fontsize=9)
            else:
                ax.text(x, 0.02, "no\ndrafter", ha="center", va="bottom", fontsize=8)
    ax.scatter([], [], color="black", marker="D", s=14, label="greedy")
    temperature = results[0].temperature if results else 1.0
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("acceptance (k=1)")
    ax.set_title(f"MTP acceptance per workload (T={temperature:g}, 95% CI)", fontsize=10)
    ax.legend(fontsize=8, loc="upper right", framealpha=0.9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", metadata={"Software": None})
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    finally:
        plt.close(fig)
