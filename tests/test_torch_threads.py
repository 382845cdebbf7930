"""torch's CPU threads follow mtpcheck's rule (src/mtpcheck/torch_threads.py).

Each case runs in a fresh interpreter: OpenMP reads ``OMP_NUM_THREADS`` and the CPU affinity
once, when torch loads, and the thread count is process-wide.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mtpcheck.errors import MtpcheckError
from mtpcheck.settings import SettingError
from mtpcheck.torch_threads import (
    THREADS_ENV,
    allowed_cpus,
    chosen_threads,
)
from tests.conftest import FIXTURES, Run

HAS_AFFINITY = hasattr(os, "sched_getaffinity")
CPUS = sorted(os.sched_getaffinity(0)) if HAS_AFFINITY else []

PROBE = """
import json, os, sys
cpus = json.loads(sys.argv[1])
if cpus:
    os.sched_setaffinity(0, cpus)  # before torch loads, as a launcher (taskset) would
import torch
from mtpcheck.torch_threads import configure_torch_threads
before = torch.get_num_threads()
returned = configure_torch_threads()
print(json.dumps({"before": before, "returned": returned, "after": torch.get_num_threads(),
                  "cpu_count": os.cpu_count()}))
"""


def _env(**settings: str) -> dict[str, str]:
    """This environment without any thread setting, plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if k not in (THREADS_ENV, "OMP_NUM_THREADS")}
    env.update(settings)
    return env


def _run(code: str, env: dict[str, str], *args: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _probe(cpus: list[int] | None = None, **settings: str) -> dict[str, int]:
    return _run(PROBE, _env(**settings), json.dumps(cpus or []))


def test_default_is_one_thread_whatever_torch_started_with() -> None:
    seen = _probe()
    assert seen["after"] == seen["returned"] == 1
    if len(CPUS) > 1:  # torch itself starts one thread per allowed CPU: the call changed it
        assert seen["before"] == len(CPUS)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to restrict the affinity to fewer")
@pytest.mark.parametrize("allowed", [1, 2])
def test_auto_is_the_cpus_the_process_may_use(allowed: int) -> None:
    seen = _probe(CPUS[:allowed], **{THREADS_ENV: "auto"})
    assert seen["after"] == seen["returned"] == allowed
    if allowed < len(CPUS):
        assert seen["cpu_count"] > allowed  # os.cpu_count() would have said more


@pytest.mark.skipif(len(CPUS) < 2, reason="torch caps OMP_NUM_THREADS at the CPU count")
def test_explicit_omp_num_threads_is_respected() -> None:
    # 2: not the default (1), so a change would show
    seen = _probe(OMP_NUM_THREADS="2")
    assert seen["before"] == seen["after"] == seen["returned"] == 2


def test_mtpcheck_setting_wins_over_omp_num_threads() -> None:
    # 3: neither OMP_NUM_THREADS nor the default nor (here) the CPU count
    seen = _probe(OMP_NUM_THREADS="2", **{THREADS_ENV: "3"})
    assert seen["after"] == seen["returned"] == 3


def test_the_rule_as_a_function() -> None:
    assert chosen_threads({}) == 1
    assert chosen_threads({"OMP_NUM_THREADS": "4"}) is None
    assert chosen_threads({"OMP_NUM_THREADS": ""}) == 1  # set but empty: no choice made
    assert chosen_threads({THREADS_ENV: " 5 ", "OMP_NUM_THREADS": "4"}) == 5
    assert chosen_threads({THREADS_ENV: "AUTO"}) == allowed_cpus()
    if HAS_AFFINITY:
        assert allowed_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", "auto2"])
def test_a_bad_setting_is_refused(bad: str) -> None:
    with pytest.raises(SettingError, match=THREADS_ENV) as caught:
        chosen_threads({THREADS_ENV: bad})
    assert isinstance(caught.value, MtpcheckError)  # the CLI says it in one line, exit 2


ACCEPT = """
import json, torch
from mtpcheck.accept.loading import open_drafter
before = torch.get_num_threads()
open_drafter(__import__("pathlib").Path(__import__("sys").argv[1]))
print(json.dumps({"before": before, "after": torch.get_num_threads()}))
"""

CONVERT = """
import json, sys, torch
from pathlib import Path
from mtpcheck.convert.builtin import hf_to_megatron
from mtpcheck.formats import open_checkpoint
before = torch.get_num_threads()
hf_to_megatron(open_checkpoint(Path(sys.argv[1])), Path(sys.argv[2]), durable=False)
print(json.dumps({"before": before, "after": torch.get_num_threads()}))
"""


def test_accept_loads_the_model_with_the_rules_threads() -> None:
    seen = _run(ACCEPT, _env(), str(FIXTURES / "accept_deepseek_v3"))
    assert seen["after"] == 1
    seen = _run(ACCEPT, _env(**{THREADS_ENV: "3"}), str(FIXTURES / "accept_deepseek_v3"))
    assert seen["after"] == 3


def test_convert_writes_megatron_with_the_rules_threads(tmp_path: Path) -> None:
    seen = _run(CONVERT, _env(), str(FIXTURES / "deepseek_v3"), str(tmp_path / "out"))
    assert seen["after"] == 1
    assert (tmp_path / "out" / "release").is_dir()


def test_accept_refuses_a_bad_setting_in_one_line(
    run_cli: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(THREADS_ENV, "two")
    fixture = FIXTURES / "accept_deepseek_v3"
    run = run_cli("accept", fixture, "--workload", f"w={fixture / 'workloads' / 'in_domain.jsonl'}")
    assert run.exit_code == 2, run
    assert f"mtpcheck: error: {THREADS_ENV}='two'" in run.stderr
