"""``torchrun -m mtpcheck roundtrip``: rank 0 converts, every rank compares its share.

With 2 processes on loopback (gloo) the JSON report and the exit code must be those of a
single-process run (only the work directory's random name and the converters' timings differ),
and the work directory must be gone afterwards. In-process, with ranks as threads, each rank
must compare exactly its share of the bytes.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.errors import InputError
from mtpcheck.mapping import as_megatron
from mtpcheck.pipeline import distributed
from mtpcheck.pipeline.options import RoundtripOptions
from mtpcheck.pipeline.roundtrip import Conversions, check, convert, open_outputs
from mtpcheck.units import human_size
from tests.conftest import FIXTURES, Run
from tests.launch import torchrun

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch (torch.distributed) not installed"
)

DAMAGING = f"{sys.executable} {Path(__file__).parent / 'converters' / 'damaging.py'}"
TORCHRUN_VARS = ("RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_PORT=", "TORCHELASTIC_")


def _torchrun(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return torchrun("roundtrip", *args, "--format", "json", timeout=180)


def _normalised(stdout: str) -> Any:
    """The report without what differs between any two runs: the work directory's random
    name and the time a converter took ('... in 1.2 s', its ``seconds``)."""

    def scrub(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: "*" if k == "seconds" else scrub(v) for k, v in node.items()}
        if isinstance(node, list):
            return [scrub(v) for v in node]
        if isinstance(node, str):
            node = re.sub(r"mtpcheck-roundtrip-\w+", "mtpcheck-roundtrip-*", node)
            return re.sub(r" in \d+\.\d s$", " in * s", node)
        return node

    return scrub(json.loads(stdout))


def _rank_codes(stderr: str) -> list[int]:
    """torchrun exits 1 when any rank fails and lists each rank's own exit code."""
    return [int(c) for c in re.findall(r"^\s*exitcode\s*:\s*(-?\d+)", stderr, re.M)]


def _same_as_one_process(run_cli: Callable[..., Run], work: Path, *args: str | Path) -> Run:
    """The single-process run (in-process: no second interpreter to start), then torchrun."""
    one = run_cli("roundtrip", *args, "--workdir", work, "--format", "json")
    assert list(work.iterdir()) == [], one
    two = _torchrun(*args, "--workdir", work)
    assert list(work.iterdir()) == [], two.stderr  # rank 0 removed it, after the others
    assert _normalised(two.stdout) == _normalised(one.stdout), two.stderr  # rank 0 only prints
    if one.exit_code == 0:
        assert two.returncode == 0 and not _rank_codes(two.stderr), two.stderr
    else:
        assert two.returncode == 1, two.stderr
        assert _rank_codes(two.stderr) == [one.exit_code] * 2, two.stderr
    return one


def _checks(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def test_clean_round_trip_on_two_ranks(run_cli: Callable[..., Run], tmp_path: Path) -> None:
    one = _same_as_one_process(run_cli, tmp_path / "work", FIXTURES / "mimo", "--all")
    assert one.exit_code == 0, one
    report = json.loads(one.stdout)
    checks = _checks(report)
    assert checks.pop(CheckName.SOURCE_SHARED_COPIES) == "skip"  # MiMo stores no copies
    assert checks.pop(CheckName.SOURCE_SERVING) == "skip"  # no engine reads MiMo's config oddly
    assert set(checks.values()) == {"pass"} and len(checks) == 16
    assert {t["status"] for t in report["tensors"]} == {"equal"}


def test_stage_2_damage_on_two_ranks(run_cli: Callable[..., Run], tmp_path: Path) -> None:
    env_seen = tmp_path / "converter-env.txt"
    config = FIXTURES / "mimo" / "config.json"
    to_hf = f"env > {env_seen} && {DAMAGING} no-swap-back {{src}} {{dst}} {config}"
    work = tmp_path / "work"
    one = _same_as_one_process(run_cli, work, FIXTURES / "mimo", "--all", "--to-hf", to_hf)
    assert one.exit_code == 1, one
    report = json.loads(one.stdout)
    assert _checks(report)[CheckName.STAGE1_TENSORS] == "pass"
    (bad,) = [t for t in report["tensors"] if t["status"] != "equal"]
    assert bad["name"] == "model.mtp_layers.0.input_proj.weight"
    # rank 0 ran the converter (the last run) as a single process would: no torchrun variables
    assert not [v for v in env_seen.read_text().splitlines() if v.startswith(TORCHRUN_VARS)]


class _ThreadRanks(distributed._Ranks):
    """Ranks as threads of one process: collectives through a barrier, no torch."""

    def __init__(
        self,
        rank: int,
        world: int,
        slots: list[Any],
        barrier: threading.Barrier,
        store: Any = None,
    ):
        self.rank, self.world, self.calls = rank, world, 0
        self._slots, self._barrier, self._store = slots, barrier, store

    def store(self) -> Any:
        return self._store

    def gather(self, payload: Any) -> list[Any]:
        self._slots[self.rank] = payload
        self._barrier.wait()
        out = list(self._slots)
        self._barrier.wait()
        return out

    def share(self, value: Any) -> Any:
        return self.gather(value)[0]


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[RoundtripOptions, Conversions]:
    opts = RoundtripOptions(FIXTURES / "mimo", all_tensors=True)
    conversions, _ = convert(opts, tmp_path_factory.mktemp("work"), lambda line: None)
    return opts, conversions


def test_each_rank_compares_only_its_share(
    converted: tuple[RoundtripOptions, Conversions], monkeypatch: pytest.MonkeyPatch
) -> None:
    opts, conversions = converted
    asked: dict[int, list[list[tuple[str, str]]]] = {0: [], 1: []}
    compare_many = distributed.compare_many

    def recording(a: Any, b: Any, pairs: Sequence[tuple[str, str]]) -> list[Any]:
        asked[int(threading.current_thread().name)].append(list(pairs))
        return compare_many(a, b, pairs)

    monkeypatch.setattr(distributed, "compare_many", recording)
    monkeypatch.setenv("MTPCHECK_PROGRESS_INTERVAL", "0")
    slots: list[Any] = [None, None]
    barrier = threading.Barrier(2, timeout=60)
    import torch.distributed

    store = torch.distributed.HashStore()
    said: dict[int, list[str]] = {0: [], 1: []}

    def rank(r: int) -> Any:
        threading.current_thread().name = str(r)
        ranks = _ThreadRanks(r, 2, slots, barrier, store)
        log = said[r].append
        return distributed._check_across(ranks, None, conversions if r == 0 else None, opts, log)

    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(rank, [0, 1]))

    opened = open_outputs(conversions, trust_pickle=False)
    alone = check(conversions, opened, all_tensors=True)
    assert reports == [alone, alone]
    assert len(asked[0]) == len(asked[1]) == 2  # one sharded compare per stage
    sides = [(as_megatron(opened.source), opened.megatron), (opened.source, opened.final)]
    for stage, (a, b) in enumerate(sides):
        mine, theirs = asked[0][stage], asked[1][stage]
        assert mine and theirs and not set(mine) & set(theirs)
        everything = sorted(mine + theirs)  # the single-process list, split by bytes
        costs = [distributed._cost(a, b, x, y) for x, y in everything]
        assert min(sum(costs[everything.index(p)] for p in s) for s in (mine, theirs)) > 0
        shares = distributed.split_by_bytes(costs, 2)
        assert [[everything[i] for i in s] for s in shares] == [mine, theirs]
    assert len(asked[0][1]) + len(asked[1][1]) == len(alone.tensors)
    # rank 0 reports both stages' comparisons whole, the bytes of both shares; rank 1 nothing
    assert said[1] == [] and len(said[0]) == 2
    for stage, (a, b) in enumerate(sides):
        pairs = asked[0][stage] + asked[1][stage]
        whole = human_size(sum(distributed._cost(a, b, x, y) for x, y in pairs))
        assert said[0][stage].startswith(f"comparing on 2 ranks: {len(pairs)} tensors, {whole} in ")


def test_an_output_one_rank_cannot_open_is_reported_by_rank_0(
    converted: tuple[RoundtripOptions, Conversions], monkeypatch: pytest.MonkeyPatch
) -> None:
    opts, conversions = converted
    real_open = distributed.open_outputs

    def open_outputs(shared: Conversions, trust_pickle: bool) -> Any:
        if threading.current_thread().name == "1":  # as a node without the shared workdir
            raise InputError(shared.stage1.output, "no such file or directory")
        return real_open(shared, trust_pickle)

    monkeypatch.setattr(distributed, "open_outputs", open_outputs)
    slots: list[Any] = [None, None]
    barrier = threading.Barrier(2, timeout=60)

    def rank(r: int) -> str:
        threading.current_thread().name = str(r)
        ranks = _ThreadRanks(r, 2, slots, barrier)
        with pytest.raises(InputError) as raised:
            distributed._check_across(
                ranks, None, conversions if r == 0 else None, opts, lambda line: None
            )
        return str(raised.value)

    with ThreadPoolExecutor(2) as pool:
        messages = list(pool.map(rank, [0, 1]))
    assert messages[0] == messages[1]
    assert messages[0].startswith(f"{conversions.stage1.output}: no such file or directory")
    assert "(on rank 1: every rank must see the same paths" in messages[0]


def test_a_damaged_source_on_two_ranks_is_reported_and_not_converted(
    run_cli: Callable[..., Run], fixture_copy: Callable[[str], Path], tmp_path: Path
) -> None:
    damaged = fixture_copy("deepseek_v3")
    shard = damaged / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])  # rank 0's audit fails: no rank converts
    one = _same_as_one_process(run_cli, tmp_path / "work", damaged)
    assert one.exit_code == 1, one
    checks = _checks(json.loads(one.stdout))
    assert (
        checks[CheckName.SOURCE_INTEGRITY] == "fail" and checks[CheckName.STAGE1_CONVERT] == "skip"
    )
    assert not any(name.startswith(("stage2", "roundtrip", "final")) for name in checks)
