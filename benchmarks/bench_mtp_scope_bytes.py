"""Benchmark 2: the default (MTP-scope) ``diff`` reads only the MTP bytes in scope.

A MiMo-layout checkpoint (8 decoder layers + 1 MTP layer, hidden 2048, random BF16, ~1.04 GiB in
3 shards) is written and copied. ``mtpcheck diff A B`` compares the MTP scope only: the MTP
layer plus the embedding and head it shares. Before every run the checkpoint files are
dropped from the page cache (``posix_fadvise(DONTNEED)`` on these files only), so the bytes
the process fetched from storage are measured as well as the bytes its ``read`` calls
returned. Both come from ``/proc/self/io`` of the mtpcheck process, read as it exits:

- ``read_bytes``: bytes fetched from storage (the checkpoint files; the interpreter's own
  files are cached);
- ``rchar`` minus the ``rchar`` of the same interpreter importing the same modules and exiting
  (its ``.pyc`` files): bytes read through system calls, from the checkpoint files.

Baseline, run alternately: a script that preads exactly the in-scope byte ranges of A and B
(the least any tool must read). Target: both figures <= 1.05 x the in-scope bytes of A + B.

    python benchmarks/bench_mtp_scope_bytes.py [--repeats 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    GIB,
    MIB,
    Measured,
    alternate,
    check_free_disk,
    child_env,
    files_under,
    machine,
    median,
    mtpcheck_cmd,
    print_table,
    run_measured,
    tensor_offset,
    write_mimo_checkpoint,
)

TARGET = 1.05

# Runs mtpcheck's CLI in this interpreter and writes /proc/self/io as it exits.
WRAPPER = """
import sys
out = sys.argv[1]
if sys.argv[2] == "--imports-only":
    import mtpcheck.checks.diff_checks, mtpcheck.cli, mtpcheck.formats, mtpcheck.report
    import mtpcheck.report.table
    rc = 0
else:
    from mtpcheck.cli import main
    rc = main(sys.argv[2:])
with open("/proc/self/io") as f:
    io = f.read()
with open(out, "w") as f:
    f.write(io)
sys.exit(rc)
"""

# The ideal reader: pread exactly the given byte ranges, 1 MiB at a time.
IDEAL = """
import json, os, sys
out = sys.argv[1]
for path, offset, nbytes in json.loads(sys.argv[2]):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
    done = 0
    while done < nbytes:
        done += len(os.pread(fd, min(1 << 20, nbytes - done), offset + done))
    os.close(fd)
with open("/proc/self/io") as f:
    io = f.read()
with open(out, "w") as f:
    f.write(io)
"""


def evict(paths: list[Path]) -> None:
    """Drop these files' pages from the page cache (clean pages only: they are synced)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def io_counters(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = int(value)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="mtpbench-scope-", dir=args.workdir))
    try:
        check_free_disk(work, int(2.2 * GIB))
        a, b = work / "A", work / "B"
        where = write_mimo_checkpoint(a)
        shutil.copytree(a, b)
        files = files_under(a) + files_under(b)
        env = child_env(work)

        check = run_measured(mtpcheck_cmd("diff", a, b, "--format", "json"), env=env)
        report = json.loads(check.stdout)
        scope = [t["name"] for t in report["tensors"]]
        ranges = []
        for root in (a, b):
            for name in scope:
                shard = root / where[name].name
                offset, nbytes = tensor_offset(shard, name)
                ranges.append((str(shard), offset, nbytes))
        in_scope = sum(n for _, _, n in ranges)
        total = sum(p.stat().st_size for p in files)
        print(
            f"A and B: {total / 2 / GIB:.2f} GiB each; MTP scope: {len(scope)} tensors, "
            f"{in_scope / MIB:.1f} MiB in A + B ({in_scope / total:.0%} of the files); "
            f"diff exit {check.returncode}, ok={report['ok']}",
            file=sys.stderr,
        )
        io_file = work / "io.txt"
        wrapper = [sys.executable, "-c", WRAPPER, io_file]
        run_measured([*wrapper, "--imports-only"], env=env)  # warm the bytecode cache
        startup = []
        for _ in range(3):
            run_measured([*wrapper, "--imports-only"], env=env)
            startup.append(io_counters(io_file)["rchar"])
        imports_rchar = median(startup)
        counters: dict[str, list[dict[str, int]]] = {"ideal": [], "mtpcheck": []}

        def measured(name: str, cmd: list) -> Measured:
            evict(files)
            m = run_measured(cmd, env=env)
            counters[name].append(io_counters(io_file))
            return m

        results = alternate(
            {
                "ideal": lambda: measured(
                    "ideal", [sys.executable, "-c", IDEAL, io_file, json.dumps(ranges)]
                ),
                "mtpcheck": lambda: measured(
                    "mtpcheck", [*wrapper, "diff", a, b, "--format", "json"]
                ),
            },
            args.repeats,
            warmup=0,
        )
        rows = []
        ok = check.returncode == 0
        for name in ("ideal", "mtpcheck"):
            read_bytes = median(c["read_bytes"] for c in counters[name])
            rchar = median(c["rchar"] for c in counters[name])
            from_files = rchar - (imports_rchar if name == "mtpcheck" else 0)
            wall = median(m.wall for m in results[name])
            rows.append(
                (
                    name,
                    f"{wall:.3f}",
                    f"{read_bytes / MIB:.1f} ({read_bytes / in_scope:.3f})",
                    f"{from_files / MIB:.1f} ({from_files / in_scope:.3f})",
                )
            )
            if name == "mtpcheck":
                ok = ok and read_bytes <= TARGET * in_scope and from_files <= TARGET * in_scope
        print(f"\nmachine: {machine()}")
        print_table(
            f"MTP-scope diff of 2 x {total / 2 / GIB:.2f} GiB, cold page cache; in scope: "
            f"{in_scope / MIB:.1f} MiB (A + B); medians of {args.repeats}",
            rows,
            ("run", "wall s", "read_bytes MiB (x scope)", "rchar from files MiB (x scope)"),
        )
        print(
            f"start-up rchar of the interpreter and modules (subtracted): "
            f"{imports_rchar / MIB:.1f} MiB; target <= {TARGET} x scope: "
            f"{'met' if ok else 'NOT met'}"
        )
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
