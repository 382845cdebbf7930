"""Benchmark 1: ``mtpcheck diff --all`` vs ``cmp -s`` on two ~1 GiB BF16 checkpoints.

A MiMo-layout checkpoint (8 decoder layers + 1 MTP layer, hidden 2048, 3 shards, random BF16
values, about 1.04 GiB) is written, copied, and one bit is flipped near the end of the last
shard, so that ``cmp -s`` (which stops at the first difference) reads as much as mtpcheck.
Both read from the page cache (every file is read once before timing).

Timed, alternately: ``cmp -s`` over each pair of files (a shell loop) and
``python -m mtpcheck diff --all A B`` (table output, interpreter start-up included).
Targets: wall ratio <= 1.5 in every round (the worst, not only the median), mtpcheck peak RSS
<= 128 MiB, the report names the tensor and the element.

    python benchmarks/bench_diff_vs_cmp.py [--repeats 5] [--threads N] [--workdir DIR]
                                           [--torchrun 1,2]

``--torchrun 1,2`` also times the same diff under ``torchrun --nproc-per-node N`` (the tensor
list split across N ranks, gloo on loopback; see benchmarks/README.md, "Cluster scale").
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    GIB,
    alternate,
    check_free_disk,
    child_env,
    files_under,
    flip_bit,
    machine,
    median,
    mtpcheck_cmd,
    print_table,
    round_ratios,
    run_measured,
    tensor_offset,
    warm_cache,
    write_mimo_checkpoint,
)

TARGET_RATIO = 1.5
TARGET_RSS_MIB = 128


def torchrun_cmd(nproc: int, *args: str | Path) -> list[str]:
    """``torchrun --nproc-per-node N -m mtpcheck ARGS`` on loopback, a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "-m",
        "mtpcheck",
        *map(str, args),
    ]


CMP_LOOP = 'rc=0; for f in "$1"/*; do cmp -s "$f" "$2/${f##*/}" || rc=1; done; exit $rc'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="MTPCHECK_THREADS")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--torchrun",
        type=lambda v: [int(n) for n in v.split(",")],
        default=[],
        metavar="N[,N]",
        help="also time torchrun --nproc-per-node N -m mtpcheck diff --all (e.g. 1,2)",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mtpbench-diff-", dir=args.workdir))
    try:
        check_free_disk(work, int(2.2 * GIB))
        a, b = work / "A", work / "B"
        where = write_mimo_checkpoint(a)
        shutil.copytree(a, b)
        # the last matrix of the last shard; flip a bit 64 elements before its end
        last_shard = max(where.values())
        in_last = [n for n, p in where.items() if p == last_shard and n.endswith("proj.weight")]
        offsets = {n: tensor_offset(b / last_shard.name, n) for n in in_last}
        name = max(offsets, key=lambda n: offsets[n][0])
        start, nbytes = offsets[name]
        flip_bit(b / last_shard.name, start + nbytes - 128, bit=3)
        element = (nbytes - 128) // 2
        total = sum(p.stat().st_size for p in files_under(a))
        print(
            f"A and B: {total / GIB:.2f} GiB each, {len(set(where.values()))} shards; "
            f"bit flipped in {name}, flat element {element}",
            file=sys.stderr,
        )
        warm_cache(files_under(a) + files_under(b))
        extra = {"MTPCHECK_THREADS": str(args.threads)} if args.threads else {}
        env = child_env(work, **extra)

        check = run_measured(mtpcheck_cmd("diff", "--all", a, b, "--format", "json"), env=env)
        report = json.loads(check.stdout)
        bad = [t for t in report["tensors"] if t["status"] != "equal"]
        named = (
            len(bad) == 1
            and bad[0]["name"] == name
            and bad[0]["differing_elements"] == 1
            and bad[0]["first_difference"]
            == [element // bad[0]["shape"][0][1], element % bad[0]["shape"][0][1]]
        )
        print(f"mtpcheck: exit {check.returncode}, findings {bad}", file=sys.stderr)

        runners = {
            "cmp -s": lambda: run_measured(["sh", "-c", CMP_LOOP, "sh", a, b]),
            "mtpcheck": lambda: run_measured(mtpcheck_cmd("diff", "--all", a, b), env=env),
        }
        for n in args.torchrun:
            runners[f"torchrun N={n}"] = lambda n=n: run_measured(
                torchrun_cmd(n, "diff", "--all", a, b), env=env
            )
        results = alternate(runners, args.repeats)
        base = median(m.wall for m in results["cmp -s"])
        ours = median(m.wall for m in results["mtpcheck"])
        rss = max(m.maxrss_mib for m in results["mtpcheck"])
        base_rss = max(m.maxrss_mib for m in results["cmp -s"])
        ratio = ours / base
        worst = max(round_ratios(results["mtpcheck"], results["cmp -s"]))
        print(f"\nmachine: {machine()}")
        print_table(
            f"diff --all on 2 x {total / GIB:.2f} GiB BF16, one flipped bit, page cache warm; "
            f"medians of {args.repeats}",
            [
                ("cmp -s (each shard pair)", f"{base:.3f}", f"{base_rss:.1f}", "", "", ""),
                (
                    "mtpcheck diff --all",
                    f"{ours:.3f}",
                    f"{rss:.1f}",
                    f"{ratio:.2f}",
                    f"{worst:.2f} ({'met' if worst <= TARGET_RATIO else 'NOT met'})",
                    "met" if rss <= TARGET_RSS_MIB else "NOT met",
                ),
            ],
            (
                "run",
                "wall s",
                "peak RSS MiB",
                "ratio of medians",
                f"worst round's ratio (<= {TARGET_RATIO})",
                f"RSS <= {TARGET_RSS_MIB}",
            ),
        )
        print(f"tensor and element named: {'yes' if named else 'NO'} ({name}, element {element})")
        if args.torchrun:
            rows = [
                (
                    f"torchrun --nproc-per-node {n}",
                    f"{median(m.wall for m in results[f'torchrun N={n}']):.3f}",
                    f"{max(m.maxrss_mib for m in results[f'torchrun N={n}']):.1f}",
                    f"{sorted({m.returncode for m in results[f'torchrun N={n}']})}",
                )
                for n in args.torchrun
            ]
            print_table(
                "the same diff under torchrun (gloo on loopback; launcher, torch import included)",
                rows,
                ("run", "wall s", "peak RSS MiB (largest process)", "exit codes"),
            )
        ok = worst <= TARGET_RATIO and rss <= TARGET_RSS_MIB and named and check.returncode == 1
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
