"""Benchmark 6: ``mtpcheck roundtrip`` at the size of real checkpoints vs ``cp -r`` twice.

Benchmark 4's round trip (built-in converters, MiMo layout, random BF16 values) on generated
checkpoints of 8 and 16 GiB (``--sizes``), beside, in the same run and on the same file
system, the disk's own bandwidth for the same amount of data (a Python loop of ``os.write``
without and with ``fsync``, reads with ``O_DIRECT`` and through the page cache, the deletion
of a written-back file) and ``cp -r`` twice, with and without ``sync`` (the round trip writes
the checkpoint twice). Each command starts after an untimed ``sync`` and a read of the source,
rounds rotate (as in benchmark 4), and the round trip reports how long each of its parts took
through ``MTPCHECK_TIMINGS`` (:mod:`mtpcheck.pipeline.timings`), so the time shows where it
goes: stage 1 (HF -> Megatron, a write of the checkpoint), stage 2 (Megatron -> HF: a read and
a write), the comparisons, the clean-up of the work directory, and the rest (interpreter,
imports, report). A size that does not fit on the disk (source + two copies, with a 20 %
margin) is reported as skipped, with the figures.

Targets, per size: round trip <= 1.5 x ``cp -r`` twice by the medians and <= 1.15 x ``cp -r``
twice + ``sync`` in the worst round; each stage within 1.3 x the disk's time for its bytes.

    python benchmarks/bench_roundtrip_scale.py [--sizes 8,16] [--repeats 3] [--warmup 1]
        [--workdir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    GIB,
    MIB,
    Measured,
    alternate,
    child_env,
    disk_shortfall,
    files_under,
    machine,
    median,
    mimo_tensors,
    mtpcheck_cmd,
    print_table,
    run_measured,
    time_read,
    time_unlink,
    time_write,
    warm_cache,
    write_mimo_checkpoint,
)

TARGET_VS_CP = 1.5
"""Round trip / ``cp -r`` twice, ratio of the medians."""
TARGET_VS_CP_SYNC = 1.15
"""Round trip / ``cp -r`` twice + ``sync``, worst round."""
TARGET_STAGE_VS_DISK = 1.3
"""A stage's time / the disk's time for the same bytes."""
SHARD_BYTES = 4 * GIB
"""Source shards of about the size real releases use (and mtpcheck's HF writer writes)."""
GB = 1e9
CP2, CP2_SYNC, OURS = "cp -r x2", "cp+sync", "mtpcheck"


# --- the checkpoint ---------------------------------------------------------------------------


def _mimo_bytes(layers: int) -> int:
    return sum(2 * _count(shape) for _, _, shape in mimo_tensors(2048, 5632, layers, 32768, 16, 4))


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def layers_for(nbytes: int) -> int:
    """Decoder layers of the generated MiMo checkpoint closest to ``nbytes`` of tensors."""
    fixed = _mimo_bytes(0)
    per_layer = _mimo_bytes(1) - fixed
    return max(1, round((nbytes - fixed) / per_layer))


def largest_tensor(layers: int) -> int:
    return max(2 * _count(shape) for _, _, shape in mimo_tensors(2048, 5632, layers, 32768, 16, 4))


# --- the disk ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Disk:
    """The disk's own figures for ``nbytes`` (one stage's amount), in seconds."""

    nbytes: int
    write: float
    """``os.write`` of ``nbytes`` to a new file, no ``fsync`` (page cache, then the disk as
    the kernel throttles writers)."""
    write_fsync: float
    read_direct: float
    read_cached: float
    unlink: float
    """Deleting the written-back file."""

    def rate(self, seconds: float) -> float:
        return self.nbytes / seconds / GB


def measure_disk(work: Path, nbytes: int) -> Disk:
    probe = work / "disk-probe"
    os.sync()
    write = time_write(probe, nbytes, fsync=False)
    read_cached = time_read(probe, direct=False)  # what of it the page cache still holds
    os.sync()
    read_direct = time_read(probe, direct=True)
    unlink = time_unlink(probe)
    os.sync()
    write_fsync = time_write(probe, nbytes, fsync=True)
    probe.unlink()
    os.sync()
    return Disk(nbytes, write, write_fsync, read_direct, read_cached, unlink)


# --- one size ---------------------------------------------------------------------------------


@dataclass
class Rounds:
    """What every timed round of one size gave."""

    walls: dict[str, list[float]]
    rss_mib: list[float]
    cp_rm: dict[str, list[float]]
    """Deleting ``cp``'s two copies after each run (untimed in the runs; for context: the
    round trip deletes its intermediates inside its run)."""
    stages: list[dict[str, dict[str, float]]]
    """Per round: stage -> {"seconds", "bytes"} from ``MTPCHECK_TIMINGS``."""
    ok: bool | None
    returncode: int


def run_rounds(src: Path, work: Path, repeats: int, warmup: int) -> Rounds:
    scratch = work / "scratch"
    timings = work / "timings.json"
    env = child_env(work, MTPCHECK_TIMINGS=str(timings))
    sources = files_under(src)
    cp_rm: dict[str, list[float]] = {CP2: [], CP2_SYNC: []}
    stages: list[dict[str, dict[str, float]]] = []

    def copy_twice(name: str, then_sync: bool) -> Callable[[], Measured]:
        def run() -> Measured:
            scratch.mkdir()
            script = f'cp -r "{src}" "{scratch}/1" && cp -r "{src}" "{scratch}/2"'
            if then_sync:
                script += f' && sync "{scratch}"/1/* "{scratch}"/2/*'
            m = run_measured(["sh", "-c", script])
            start = time.perf_counter()
            shutil.rmtree(scratch)
            cp_rm[name].append(time.perf_counter() - start)
            return m

        return run

    def roundtrip() -> Measured:
        scratch.mkdir()
        m = run_measured(
            mtpcheck_cmd("roundtrip", src, "--workdir", scratch, "--format", "json"), env=env
        )
        shutil.rmtree(scratch)
        parts = json.loads(timings.read_text())["stages"] if timings.exists() else []
        timings.unlink(missing_ok=True)
        stages.append({p["stage"]: {"seconds": p["seconds"], "bytes": p["bytes"]} for p in parts})
        return m

    def settle() -> None:
        """Untimed, before every command: nothing dirty left for its writes to wait behind,
        and the source read back into the page cache (as in benchmark 4)."""
        os.sync()
        warm_cache(sources)

    runners = {
        CP2: copy_twice(CP2, False),
        CP2_SYNC: copy_twice(CP2_SYNC, True),
        OURS: roundtrip,
    }
    results = alternate(runners, repeats, warmup=warmup, before_each=settle, rotate=True)
    last = results[OURS][-1]
    try:
        ok = json.loads(last.stdout).get("ok")
    except ValueError:
        ok = None
    return Rounds(
        walls={name: [m.wall for m in ms] for name, ms in results.items()},
        rss_mib=[m.maxrss_mib for m in results[OURS]],
        cp_rm={name: times[warmup:] for name, times in cp_rm.items()},
        stages=stages[warmup:],
        ok=ok,
        returncode=last.returncode,
    )


STAGES = (
    ("stage1-convert", "stage 1: HF -> Megatron (write)"),
    ("stage2-convert", "stage 2: Megatron -> HF (read + write)"),
    ("compare-stage1", "compare stage 1 (read both)"),
    ("compare-stage2", "compare stage 2 (read both)"),
    ("cleanup", "delete the work directory"),
)
OTHER_PARTS = ("source-audit", "stage1-import", "stage1-open", "stage2-open")


def summarise(size_gib: float, layers: int, nbytes: int, disk: Disk, r: Rounds) -> dict[str, Any]:
    """Medians, worst rounds, ratios, per-stage rates and the targets of one size."""
    cp2, synced, ours = (r.walls[n] for n in (CP2, CP2_SYNC, OURS))
    vs_cp = [o / b for o, b in zip(ours, cp2, strict=True)]
    vs_sync = [o / b for o, b in zip(ours, synced, strict=True)]
    # the round trip deletes its two copies inside its run; cp's deletion is timed apart
    with_rm = {n: [w + d for w, d in zip(r.walls[n], r.cp_rm[n], strict=True)] for n in r.cp_rm}
    stages: dict[str, dict[str, float]] = {}
    for key, _ in (*STAGES, *((p, p) for p in OTHER_PARTS)):
        seconds = [s[key]["seconds"] for s in r.stages if key in s]
        moved = [s[key]["bytes"] for s in r.stages if key in s]
        if seconds:
            stages[key] = {"median_s": median(seconds), "worst_s": max(seconds)}
            if moved and moved[0]:
                stages[key]["bytes"] = moved[0]
                stages[key]["median_gb_s"] = moved[0] / median(seconds) / GB
    # the rest: interpreter start-up, imports, the report (the round's wall minus its parts)
    rest = [w - sum(p["seconds"] for p in s.values()) for w, s in zip(ours, r.stages, strict=True)]
    stage_vs_disk = {
        # each conversion writes the checkpoint once; the disk's time for the same bytes
        key: stages[key]["median_s"] / (disk.write * stages[key]["bytes"] / disk.nbytes)
        for key in ("stage1-convert", "stage2-convert")
        if key in stages and "bytes" in stages[key]
    }
    summary = {
        "size_gib": size_gib,
        "layers": layers,
        "checkpoint_bytes": nbytes,
        "disk": {
            **asdict(disk),
            "write_gb_s": disk.rate(disk.write),
            "write_fsync_gb_s": disk.rate(disk.write_fsync),
            "read_direct_gb_s": disk.rate(disk.read_direct),
            "read_cached_gb_s": disk.rate(disk.read_cached),
        },
        "walls": r.walls,
        "median_s": {name: median(v) for name, v in r.walls.items()},
        "worst_s": {name: max(v) for name, v in r.walls.items()},
        "ratio_vs_cp_median": median(ours) / median(cp2),
        "ratio_vs_cp_worst_round": max(vs_cp),
        "ratio_vs_cp_sync_median": median(ours) / median(synced),
        "ratio_vs_cp_sync_worst_round": max(vs_sync),
        "cp_rm_median_s": {name: median(v) for name, v in r.cp_rm.items() if v},
        "cp_rm_s": r.cp_rm,
        "ratio_vs_cp_and_rm_median": median(ours) / median(with_rm[CP2]),
        "ratio_vs_cp_sync_and_rm_median": median(ours) / median(with_rm[CP2_SYNC]),
        "ratio_vs_cp_sync_and_rm_worst_round": max(
            o / b for o, b in zip(ours, with_rm[CP2_SYNC], strict=True)
        ),
        "stages": stages,
        "rest_median_s": median(rest),
        "stage_vs_disk_write": stage_vs_disk,
        "peak_rss_mib": max(r.rss_mib),
        "rss_target_mib": 2 * largest_tensor(layers) / MIB + 300,
        "verdict_ok": r.ok,
        "returncode": r.returncode,
    }
    summary["targets"] = {
        "vs_cp_median": summary["ratio_vs_cp_median"] <= TARGET_VS_CP,
        "vs_cp_sync_worst_round": summary["ratio_vs_cp_sync_worst_round"] <= TARGET_VS_CP_SYNC,
        "stages_vs_disk": all(v <= TARGET_STAGE_VS_DISK for v in stage_vs_disk.values()),
        "rss": summary["peak_rss_mib"] <= summary["rss_target_mib"],
        "verdict": r.ok is True and r.returncode == 0,
    }
    return summary


def run_size(size_gib: float, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    layers = layers_for(int(size_gib * GIB))
    nbytes = _mimo_bytes(layers)
    # at any time: the source and two copies (cp's, or the round trip's two stages)
    reason = disk_shortfall(work, 3 * nbytes)
    if reason is not None:
        print(f"\n{size_gib:g} GiB: skipped: {reason}", file=sys.stderr)
        return {
            "size_gib": size_gib,
            "layers": layers,
            "checkpoint_bytes": nbytes,
            "skipped": reason,
        }
    src = work / f"src-{size_gib:g}"
    try:
        print(f"\n{size_gib:g} GiB: writing the source ({layers} layers)", file=sys.stderr)
        write_mimo_checkpoint(src, layers=layers, shard_bytes=SHARD_BYTES)
        disk = measure_disk(work, nbytes)
        print(f"  disk: {_disk_line(disk)}", file=sys.stderr, flush=True)
        rounds = run_rounds(src, work, args.repeats, args.warmup)
        after = measure_disk(work, nbytes)
        print(f"  disk, after the rounds: {_disk_line(after)}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    summary = summarise(size_gib, layers, nbytes, disk, rounds)
    summary["disk_after"] = {
        **asdict(after),
        "write_gb_s": after.rate(after.write),
        "write_fsync_gb_s": after.rate(after.write_fsync),
    }
    return summary


def _disk_line(d: Disk) -> str:
    return (
        f"write {d.rate(d.write):.2f} GB/s, write+fsync {d.rate(d.write_fsync):.2f} GB/s, "
        f"read O_DIRECT {d.rate(d.read_direct):.2f} GB/s, read cached "
        f"{d.rate(d.read_cached):.2f} GB/s, delete {d.unlink:.2f} s"
    )


# --- output -----------------------------------------------------------------------------------


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def print_size(s: dict[str, Any], repeats: int) -> None:
    if "skipped" in s:
        print(
            f"\n{s['size_gib']:g} GiB ({s['checkpoint_bytes'] / GIB:.2f} GiB): "
            f"skipped: {s['skipped']}"
        )
        return
    med, worst, t = s["median_s"], s["worst_s"], s["targets"]
    size = s["checkpoint_bytes"]
    print_table(
        f"roundtrip of {size / GIB:.2f} GiB (MiMo layout, {s['layers']} + 1 MTP layers) vs "
        f"cp -r twice; medians and worst of {repeats} rounds",
        [
            (CP2, f"{med[CP2]:.2f}", f"{worst[CP2]:.2f}", f"{2 * size / med[CP2] / GB:.2f}", ""),
            (
                CP2_SYNC,
                f"{med[CP2_SYNC]:.2f}",
                f"{worst[CP2_SYNC]:.2f}",
                f"{2 * size / med[CP2_SYNC] / GB:.2f}",
                "",
            ),
            (
                "mtpcheck roundtrip",
                f"{med[OURS]:.2f}",
                f"{worst[OURS]:.2f}",
                f"{2 * size / med[OURS] / GB:.2f}",
                f"{s['peak_rss_mib']:.0f} (target {s['rss_target_mib']:.0f}: {_met(t['rss'])})",
            ),
        ],
        ("run", "median s", "worst s", "GB written/s", "peak RSS MiB"),
    )
    print(
        f"ratio to cp -r twice: {s['ratio_vs_cp_median']:.2f} by the medians (<= {TARGET_VS_CP:g}: "
        f"{_met(t['vs_cp_median'])}), worst round {s['ratio_vs_cp_worst_round']:.2f}"
    )
    print(
        f"ratio to cp -r twice + sync: {s['ratio_vs_cp_sync_median']:.2f} by the medians, worst "
        f"round {s['ratio_vs_cp_sync_worst_round']:.2f} (<= {TARGET_VS_CP_SYNC:g}: "
        f"{_met(t['vs_cp_sync_worst_round'])})"
    )
    disk = s["disk"]
    print(
        f"disk ({disk['nbytes'] / GIB:.2f} GiB): write {disk['write_gb_s']:.2f} GB/s, "
        f"write+fsync {disk['write_fsync_gb_s']:.2f}, "
        f"read O_DIRECT {disk['read_direct_gb_s']:.2f}, "
        f"read cached {disk['read_cached_gb_s']:.2f}; deleting it once written back "
        f"{disk['unlink']:.2f} s (after the rounds: write {s['disk_after']['write_gb_s']:.2f}, "
        f"write+fsync {s['disk_after']['write_fsync_gb_s']:.2f} GB/s)"
    )
    rows = []
    for key, label in STAGES:
        st = s["stages"].get(key)
        if st is None:
            continue
        rate = f"{st['median_gb_s']:.2f}" if "median_gb_s" in st else ""
        vs = s["stage_vs_disk_write"].get(key)
        rows.append(
            (
                label,
                f"{st['median_s']:.2f}",
                f"{st['worst_s']:.2f}",
                rate,
                f"{vs:.2f}" if vs else "",
            )
        )
    others = sum(s["stages"][p]["median_s"] for p in OTHER_PARTS if p in s["stages"])
    rows.append(("audit, writer import, opening outputs", f"{others:.2f}", "", "", ""))
    rows.append(("the rest (start-up, imports, report)", f"{s['rest_median_s']:.2f}", "", "", ""))
    print_table(
        "where the round trip's time goes (MTPCHECK_TIMINGS), per part",
        rows,
        ("part", "median s", "worst s", "GB/s", f"x disk write (<= {TARGET_STAGE_VS_DISK:g})"),
    )
    rm = s["cp_rm_median_s"]
    print(
        "for context, deleting cp's two copies afterwards (untimed above): "
        f"{median(rm.values()):.2f} s; counted in, as the round trip's own deletion is: "
        f"ratio to cp -r twice + rm {s['ratio_vs_cp_and_rm_median']:.2f} by the medians, to "
        f"cp -r twice + sync + rm {s['ratio_vs_cp_sync_and_rm_median']:.2f} (worst round "
        f"{s['ratio_vs_cp_sync_and_rm_worst_round']:.2f})"
    )
    print(f"roundtrip verdict: ok={s['verdict_ok']}, exit {s['returncode']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,16", help="checkpoint sizes in GiB, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args()
    sizes = [float(x) for x in args.sizes.split(",") if x]

    work = Path(tempfile.mkdtemp(prefix="mtpbench-scale-", dir=args.workdir))
    try:
        summaries = [run_size(size, args, work) for size in sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmachine: {machine()}")
    for s in summaries:
        print_size(s, args.repeats)
    if args.json is not None:
        args.json.write_text(
            json.dumps({"machine": machine(), "sizes": summaries}, indent=1) + "\n"
        )
    measured = [s for s in summaries if "skipped" not in s]
    ok = bool(measured) and all(all(s["targets"].values()) for s in measured)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
