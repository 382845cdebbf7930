"""``--plot``: a PNG bar chart of acceptance per workload (and per checkpoint)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mtpcheck.errors import InputError, MtpcheckError
from mtpcheck.model import Estimate, Report


def _label(path: str, index: int, count: int) -> str:
    name = Path(path).name or path
    return f"{'AB'[index]}: {name}" if count == 2 else name


@dataclass(frozen=True)
class _Bar:
    checkpoint: str
    workload: str
    value: Estimate
    dot: float | None
    drafter: bool = True


def _bars(report: Report) -> tuple[list[_Bar], str, str, str]:
    """(bars, bar label, y label, title): the engine's position-1 acceptance for
    ``--engine``, else alpha with greedy as a dot."""
    if report.engine:
        first = report.engine[0]
        bars = [_Bar(e.checkpoint, e.workload, e.by_position[0], None) for e in report.engine]
        title = f"MTP acceptance in {first.engine} (k={first.k}, T={first.temperature:g}, 95% CI)"
        return bars, "position 1", "accepted at position 1", title
    bars = [
        _Bar(r.checkpoint, r.workload, r.alpha, r.greedy.value, r.drafter)
        for r in report.acceptance
    ]
    temperature = report.acceptance[0].temperature if report.acceptance else 1.0
    title = f"MTP acceptance per workload (T={temperature:g}, 95% CI)"
    return bars, "α", "acceptance (k=1)", title


def write_plot(report: Report, path: Path) -> None:
    """Bars: alpha with its 95 % interval; dots: greedy acceptance (``--engine``: the engine's
    position-1 acceptance). One group per workload."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - matplotlib is a dependency
        raise MtpcheckError(f"--plot needs matplotlib: {e}") from e

    bars, bar_label, y_label, title = _bars(report)
    workloads = list(dict.fromkeys(b.workload for b in bars))
    checkpoints = list(dict.fromkeys(b.checkpoint for b in bars))
    by_key = {(b.checkpoint, b.workload): b for b in bars}
    width = 0.8 / max(1, len(checkpoints))
    colours = ("#4C72B0", "#DD8452")
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(workloads) + 1.5), 3.2), dpi=100)
    for c, checkpoint in enumerate(checkpoints):
        row = [by_key[(checkpoint, w)] for w in workloads]
        xs = [w + (c - (len(checkpoints) - 1) / 2) * width for w in range(len(workloads))]
        values = [b.value.value for b in row]
        lows = [b.value.value - (b.value.low if b.value.low is not None else b.value.value)
                for b in row]  # fmt: skip
        highs = [(b.value.high if b.value.high is not None else b.value.value) - b.value.value
                 for b in row]  # fmt: skip
        label = _label(checkpoint, c, len(checkpoints))
        ax.bar(
            xs,
            values,
            width * 0.9,
            yerr=[lows, highs],
            capsize=3,
            color=colours[c % 2],
            label=f"{label}: {bar_label}",
        )
        dots = [(x, b.dot) for x, b in zip(xs, row, strict=True) if b.dot is not None]
        if dots:
            dot_xs, dot_ys = zip(*dots, strict=True)
            ax.scatter(dot_xs, dot_ys, color="black", marker="D", s=14, zorder=3)
        for x, b in zip(xs, row, strict=True):
            if b.drafter:
                value = b.value.value
                ax.text(x, value / 2, f"{value:.2f}", ha="center", color="white", fontsize=9)
            else:
                ax.text(x, 0.02, "no\ndrafter", ha="center", va="bottom", fontsize=8)
    if any(b.dot is not None for b in bars):
        ax.scatter([], [], color="black", marker="D", s=14, label="greedy")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylim(0, 1.12)
    ax.set_ylabel(y_label)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right", framealpha=0.9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png", metadata={"Software": None})
    except OSError as e:
        raise InputError(path, e.strerror or str(e)) from e
    finally:
        plt.close(fig)
