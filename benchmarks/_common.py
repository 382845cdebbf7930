"""Shared helpers of the benchmarks: data writers, a measured child runner, medians.

Standard library only, so a benchmark's own imports never weigh on what it measures.
Each benchmark runs the baseline and mtpcheck alternately in one run and reports medians.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
GIB = 1024 * MIB
ROOT = Path(__file__).resolve().parent.parent

# element width in bytes of the dtypes the generators write
WIDTH = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I64": 8}


def mtpcheck_cmd(*args: str | os.PathLike[str]) -> list[str]:
    """``python -m mtpcheck ARGS`` with the interpreter running the benchmark."""
    return [sys.executable, "-m", "mtpcheck", *map(str, args)]


@dataclass
class Measured:
    """One child process: wall time, peak RSS, exit code and captured stdout."""

    wall: float
    maxrss_mib: float
    returncode: int
    stdout: str = ""
    cpu: float = 0.0
    """User + system CPU seconds of the process (and the children it waited for)."""


TIME = "/usr/bin/time"


def run_measured(
    cmd: Sequence[str | os.PathLike[str]],
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Measured:
    """Run ``cmd``, returning its wall time, its own peak RSS and CPU time.

    Peak RSS (and CPU time) come from GNU ``/usr/bin/time -f "%U %S %M"``: a process's
    ``ru_maxrss`` keeps the RSS it had before ``exec``, so a child forked straight from this
    (larger) Python process would report at least this process's RSS. Without
    ``/usr/bin/time`` the ``wait4`` figures are used (RSS then an upper bound). stdout goes to
    a temporary file, stderr is inherited.
    """
    with tempfile.TemporaryFile() as out, tempfile.NamedTemporaryFile("r") as rss:
        argv = [str(c) for c in cmd]
        if os.access(TIME, os.X_OK):
            argv = [TIME, "-f", "%U %S %M", "-o", rss.name, *argv]
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode("utf-8", "replace")
        words = rss.read().split()
        if len(words) >= 3 and words[-1].isdigit():
            maxrss_kib, cpu = int(words[-1]), float(words[-3]) + float(words[-2])
        else:
            maxrss_kib, cpu = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    return Measured(wall, maxrss_kib / 1024, proc.returncode, text, cpu)


def alternate(
    runners: dict[str, Callable[[], Measured]],
    repeats: int,
    warmup: int = 1,
    before_each: Callable[[], None] | None = None,
    rotate: bool = False,
) -> dict[str, list[Measured]]:
    """Run every runner in turn, ``repeats`` rounds (after ``warmup`` untimed rounds);
    ``before_each`` (untimed) runs before every runner. With ``rotate`` each round starts one
    runner later, so that no runner always follows the same one (what a command leaves
    behind, e.g. freed disk blocks, can slow the next)."""
    results: dict[str, list[Measured]] = {name: [] for name in runners}
    order = list(runners.items())
    for round_ in range(warmup + repeats):
        shift = round_ % len(order) if rotate else 0
        for name, runner in order[shift:] + order[:shift]:
            if before_each is not None:
                before_each()
            m = runner()
            if round_ >= warmup:
                results[name].append(m)
            tag = "warmup" if round_ < warmup else f"round {round_ - warmup + 1}/{repeats}"
            print(
                f"  {tag:>12}  {name:<10} {m.wall:8.3f} s  rss {m.maxrss_mib:8.1f} MiB  "
                f"rc {m.returncode}",
                file=sys.stderr,
                flush=True,
            )
    return results


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def round_ratios(ours: list[Measured], base: list[Measured]) -> list[float]:
    """Wall-time ratio of each round (``alternate`` runs both in every round, back to back)."""
    return [o.wall / b.wall for o, b in zip(ours, base, strict=True)]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return f"{cpu}, {os.cpu_count()} CPUs, {mem:.0f} GiB RAM, Python {platform.python_version()}"


def print_table(title: str, rows: list[tuple[str, ...]], header: tuple[str, ...]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)))


def disk_shortfall(where: Path, needed: int) -> str | None:
    """Why ``needed`` bytes (plus a 20 % margin) do not fit under ``where``; None if they do."""
    free = os.statvfs(where).f_bavail * os.statvfs(where).f_frsize
    if free < needed * 1.2:
        return (
            f"benchmark needs about {needed / GIB:.1f} GiB free under {where}, "
            f"{free / GIB:.1f} GiB free (use --workdir)"
        )
    return None


def check_free_disk(where: Path, needed: int) -> None:
    """Exit with the reason when ``needed`` bytes do not fit under ``where``."""
    reason = disk_shortfall(where, needed)
    if reason is not None:
        sys.exit(reason)


# --- safetensors writers -------------------------------------------------------------------


def header_blob(entries: list[tuple[str, str, tuple[int, ...]]]) -> tuple[bytes, int]:
    """The safetensors header (length prefix + JSON) of ``entries``; and the data size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in entries:
        n = WIDTH[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    return struct.pack("<Q", len(blob)) + blob, offset


def write_random_shard(
    path: Path, entries: list[tuple[str, str, tuple[int, ...]]], seed: int = 0
) -> int:
    """Write a safetensors file whose data is pseudo-random (a repeated random block).

    Returns the absolute file offset of the first data byte.
    """
    head, size = header_blob(entries)
    block = _random_block(seed)
    with open(path, "wb") as f:
        f.write(head)
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n] if n < len(block) else block)
            left -= n
    return len(head)


def write_sparse_shard(path: Path, entries: list[tuple[str, str, tuple[int, ...]]]) -> int:
    """Write only the header and extend the file to its full size as a hole (sparse file)."""
    head, size = header_blob(entries)
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(len(head) + size)
    return len(head) + size


# clears the top exponent bit of a byte: the high byte of a little-endian BF16, F16 or F32
_FINITE_HIGH_BYTE = bytes(b & 0xBF for b in range(256))


def _random_block(seed: int, size: int = 8 * MIB + 4096) -> bytes:
    """An odd-sized random block, so consecutive tensors do not repeat each other exactly.

    Every odd byte (the high byte of each 2-byte element, as the block is laid at even
    offsets) has its top exponent bit cleared, so BF16 and F16 values are finite (|x| < 2):
    raw random bits hold infinities and NaNs, which no real checkpoint does and which
    ``inspect``'s value statistics need not expect.
    """
    import random

    block = bytearray(random.Random(seed).randbytes(size))
    block[1::2] = block[1::2].translate(_FINITE_HIGH_BYTE)
    return bytes(block)


def write_index(root: Path, weight_map: dict[str, str], total: int) -> None:
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def tensor_offset(path: Path, name: str) -> tuple[int, int]:
    """(absolute offset, nbytes) of tensor ``name`` in a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    begin, end = header[name]["data_offsets"]
    return 8 + n + begin, end - begin


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def sync_files(paths: Iterable[Path]) -> None:
    """fsync freshly written files, so that their writeback does not run during timed runs."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def warm_cache(paths: Iterable[Path]) -> None:
    """Read files once so the timed runs find them in the page cache (syncing them first)."""
    paths = list(paths)
    sync_files(paths)
    buf = bytearray(8 * MIB)
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


# --- the disk's own bandwidth ----------------------------------------------------------------


def time_write(path: Path, nbytes: int, fsync: bool, block: int = 8 * MIB) -> float:
    """Seconds to write ``nbytes`` of random data to a new file with ``os.write`` (then
    ``fsync`` it, if asked): the page cache's and the disk's rate for a stage's amount."""
    data = memoryview(_random_block(7, block))
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left:
            left -= os.write(fd, data[: min(left, block)])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def time_read(path: Path, direct: bool, block: int = 8 * MIB) -> float:
    """Seconds to read ``path`` once: from the disk (``O_DIRECT``, the page cache bypassed)
    or through the page cache (as it is)."""
    import mmap

    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
    flags = os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0)
    start = time.perf_counter()
    fd = os.open(path, flags)
    try:
        while os.readv(fd, [buf]):
            pass
    finally:
        os.close(fd)
    return time.perf_counter() - start


def time_unlink(path: Path) -> float:
    """Seconds to delete a file (blocks freed; on a file system mounted with ``discard``,
    trimmed)."""
    start = time.perf_counter()
    path.unlink()
    return time.perf_counter() - start


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


# --- a MiMo-layout checkpoint (dense Qwen2 decoder + one MTP layer), scaled up ----------------


def mimo_tensors(
    hidden: int, inter: int, layers: int, vocab: int, heads: int, kv_heads: int
) -> list[tuple[str, str, tuple[int, ...]]]:
    """The tensor names and shapes of a MiMo checkpoint (as the shipped fixture), in BF16."""
    head_dim = hidden // heads
    kv = kv_heads * head_dim

    def block(p: str) -> list[tuple[str, str, tuple[int, ...]]]:
        return [
            (f"{p}input_layernorm.weight", "BF16", (hidden,)),
            (f"{p}post_attention_layernorm.weight", "BF16", (hidden,)),
            (f"{p}self_attn.q_proj.weight", "BF16", (hidden, hidden)),
            (f"{p}self_attn.q_proj.bias", "BF16", (hidden,)),
            (f"{p}self_attn.k_proj.weight", "BF16", (kv, hidden)),
            (f"{p}self_attn.k_proj.bias", "BF16", (kv,)),
            (f"{p}self_attn.v_proj.weight", "BF16", (kv, hidden)),
            (f"{p}self_attn.v_proj.bias", "BF16", (kv,)),
            (f"{p}self_attn.o_proj.weight", "BF16", (hidden, hidden)),
            (f"{p}mlp.gate_proj.weight", "BF16", (inter, hidden)),
            (f"{p}mlp.up_proj.weight", "BF16", (inter, hidden)),
            (f"{p}mlp.down_proj.weight", "BF16", (hidden, inter)),
        ]

    out = [
        ("model.embed_tokens.weight", "BF16", (vocab, hidden)),
        ("lm_head.weight", "BF16", (vocab, hidden)),
        ("model.norm.weight", "BF16", (hidden,)),
    ]
    for k in range(layers):
        out += block(f"model.layers.{k}.")
    p = "model.mtp_layers.0."
    out += block(p) + [
        (f"{p}token_layernorm.weight", "BF16", (hidden,)),
        (f"{p}hidden_layernorm.weight", "BF16", (hidden,)),
        (f"{p}input_proj.weight", "BF16", (hidden, 2 * hidden)),
        (f"{p}final_layernorm.weight", "BF16", (hidden,)),
    ]
    return sorted(out)


def mimo_config(
    hidden: int, inter: int, layers: int, vocab: int, heads: int, kv_heads: int
) -> dict:
    config = json.loads((ROOT / "fixtures" / "mimo" / "config.json").read_text())
    config.update(
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        vocab_size=vocab,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        layer_types=["full_attention"] * layers,
    )
    return config


def write_mimo_checkpoint(
    root: Path,
    hidden: int = 2048,
    inter: int = 5632,
    layers: int = 8,
    vocab: int = 32768,
    heads: int = 16,
    kv_heads: int = 4,
    shard_bytes: int = 512 * MIB,
    seed: int = 0,
) -> dict[str, Path]:
    """Write a random-valued MiMo checkpoint (shards + index + config); name -> shard path."""
    root.mkdir(parents=True, exist_ok=True)
    tensors = mimo_tensors(hidden, inter, layers, vocab, heads, kv_heads)
    shards: list[list[tuple[str, str, tuple[int, ...]]]] = [[]]
    size = 0
    for t in tensors:
        n = 2
        for d in t[2]:
            n *= d
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += n
    where: dict[str, Path] = {}
    total = 0
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        write_random_shard(root / name, shard, seed=seed + number)
        where.update({t[0]: root / name for t in shard})
        total += header_blob(shard)[1]
    write_index(root, {n: p.name for n, p in where.items()}, total)
    config = mimo_config(hidden, inter, layers, vocab, heads, kv_heads)
    (root / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return where


def child_env(work: Path, **extra: str) -> dict[str, str]:
    """Environment of the timed mtpcheck runs: bytecode cached (under ``work``), as installed.

    ``PYTHONDONTWRITEBYTECODE`` is dropped so that start-up does not recompile mtpcheck on
    every run (an installed package has its ``.pyc`` files); the cache goes to ``work``.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
    env.update(extra)
    return env
