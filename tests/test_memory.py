"""Freed heap memory goes back to the system between round-trip stages (glibc)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from mtpcheck.pipeline.memory import _malloc_trim

SCRIPT = textwrap.dedent(
    """
    from mtpcheck.pipeline.memory import release_free_memory

    def rss_mib():
        with open("/proc/self/status") as f:
            line = next(line for line in f if line.startswith("VmRSS"))
        return int(line.split()[1]) // 1024

    # 30 MiB of 100 KiB heap blocks, each followed by a small block still in use, so freeing
    # them leaves holes inside the heap that free() alone does not give back
    blocks, pins = [], []
    for _ in range(300):
        block = bytearray(100 * 1024)
        block[::4096] = b"\\1" * len(block[::4096])
        blocks.append(block)
        pins.append(bytearray(600))
    del blocks
    before = rss_mib()
    assert release_free_memory()
    print(before, rss_mib())
    """
)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _malloc_trim() is None, reason="needs glibc"
)
def test_freed_heap_blocks_are_returned() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert before - after >= 20, (before, after)
