"""How many CPU threads torch computes with: one rule for every command that runs torch.

torch's CPU wheel parallelises an operation over an OpenMP team (GNU libgomp) of as many threads
as the CPUs the process may use. On a busy machine that team collapses: its threads meet at a
barrier after every operation, and while one of them waits for a CPU, the others spin at the
barrier (libgomp's default wait policy) instead of yielding theirs. mtpcheck's torch work runs
thousands of small operations (the accept fixtures' tensors are a few KB; the converters copy
and cast tensors whose time is memory and disk), which a second thread does not make faster
even on an idle machine, while on a loaded one the spinning made ``accept --online`` on the
shipped fixture 3.8 times slower than one thread (figures and commands: docs/performance.md,
"Torch's CPU threads"). Letting the threads sleep instead (``OMP_WAIT_POLICY=passive``) works
only if set before torch loads, and was slower on an idle machine.

The rule, applied by :func:`configure_torch_threads` where mtpcheck starts torch work:

1. ``MTPCHECK_TORCH_THREADS=N`` (a positive integer) uses N threads, and
   ``MTPCHECK_TORCH_THREADS=auto`` one per CPU this process may use (its CPU affinity,
   ``os.sched_getaffinity``; not ``os.cpu_count()``, which counts CPUs the process may be
   barred from; a cgroup CPU quota is not read);
2. otherwise, when ``OMP_NUM_THREADS`` is set, torch keeps the count OpenMP took from it;
3. otherwise one thread.

Only the intra-op count is set: mtpcheck starts no inter-op work (no ``torch.jit.fork``), so
torch never starts that pool, and its size, which torch lets a process set once, is left to
whoever needs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from mtpcheck.settings import TORCH_THREADS

THREADS_ENV = TORCH_THREADS.name
"""``N`` or ``auto``: torch's intra-op threads for mtpcheck's work (see the module's rule)."""
DEFAULT_THREADS = 1
"""Without a choice by the user: one thread, which does not collapse on a busy machine."""


def allowed_cpus() -> int:
    """The CPUs this process may run on (its affinity mask), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)  # macOS and Windows have no affinity call


def chosen_threads(environ: Mapping[str, str] | None = None) -> int | None:
    """Intra-op threads by the rule, or ``None`` where the user's ``OMP_NUM_THREADS`` decides.

    Raises :class:`~mtpcheck.settings.SettingError` for a ``MTPCHECK_TORCH_THREADS`` that is
    neither a positive integer nor ``auto`` (a typo must not silently fall back to the default).
    """
    env = os.environ if environ is None else environ
    if env.get(THREADS_ENV, "").strip():
        return TORCH_THREADS.value(env) or allowed_cpus()  # None: ``auto``
    if env.get("OMP_NUM_THREADS", "").strip():
        return None
    return DEFAULT_THREADS


def configure_torch_threads() -> int:
    """Set torch's intra-op threads by the rule; return the count torch then reports.

    Cheap and idempotent: call it where torch work starts. ``torch.set_num_threads`` takes
    effect at once (it resizes the OpenMP team and MKL's), whenever torch was imported.
    """
    import torch

    threads = chosen_threads()
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
