"""Progress of long comparisons: what the lines say, when they come, where they go."""

from __future__ import annotations

import json
from collections.abc import Sequence

from mtpcheck.model import TensorComparison, TensorMeta, TensorStatus
from mtpcheck.pipeline import progress
from tests.conftest import FIXTURES

MiB = 2**20


class _Ckpt:
    """Just the tensor index the progress reporter sizes its batches by."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.tensors = {n: TensorMeta(n, "U8", (s,), "f", 0, s, True) for n, s in sizes.items()}


def test_lines_say_bytes_rate_time_left_and_tensor_every_interval() -> None:
    sizes = {f"t{i}": 256 * MiB for i in range(8)}  # 8 batches of 256 MiB, 2 GiB in all
    ckpt = _Ckpt(sizes)
    calls: list[list[str]] = []
    now = [0.0]

    def compare(a: object, b: object, pairs: Sequence[tuple[str, str]]) -> list[TensorComparison]:
        calls.append([p[0] for p in pairs])
        now[0] += 2.0  # 128 MiB/s
        return [
            TensorComparison(p[0], TensorStatus.EQUAL, ("U8", "U8"), ((1,), (1,))) for p in pairs
        ]

    lines: list[str] = []
    run = progress.with_progress(compare, "comparing", lines.append, 5.0, lambda: now[0])
    results = run(ckpt, ckpt, [(n, n) for n in sizes])  # type: ignore[arg-type]
    assert [r.name for r in results] == list(sizes)
    assert calls == [[f"t{i}"] for i in range(8)]
    assert lines == [
        "comparing: 768.00 MiB of 2.00 GiB (38%), 128.00 MiB/s, about 10 s left, at t2",
        "comparing: 1.50 GiB of 2.00 GiB (75%), 128.00 MiB/s, about 4 s left, at t5",
        "comparing: 8 tensors, 2.00 GiB in 16 s (128.00 MiB/s)",
    ]


def test_a_short_comparison_prints_nothing() -> None:
    ckpt = _Ckpt({"a": 10, "b": 20})
    lines: list[str] = []
    run = progress.with_progress(
        lambda a, b, pairs: [
            TensorComparison(p[0], TensorStatus.EQUAL, ("U8", "U8"), ((1,), (1,))) for p in pairs
        ],
        "comparing",
        lines.append,
        5.0,
        lambda: 0.0,
    )
    assert len(run(ckpt, ckpt, [("a", "a"), ("b", "b")])) == 2  # type: ignore[arg-type]
    assert lines == []


def test_progress_goes_to_stderr_and_quiet_silences_it(run_cli, monkeypatch) -> None:

    monkeypatch.setenv("MTPCHECK_PROGRESS_INTERVAL", "0")
    args = ["diff", FIXTURES / "deepseek_v3", FIXTURES / "deepseek_v3", "--all", "--format", "json"]
    loud = run_cli(*args)
    assert loud.exit_code == 0, loud
    assert json.loads(loud.stdout)["ok"] is True  # stdout is the report alone
    assert loud.stderr.startswith("mtpcheck: comparing: 73 tensors, ")
    quiet = run_cli(*args, "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert json.loads(quiet.stdout) == json.loads(loud.stdout)


def test_units() -> None:
    from mtpcheck.units import human_duration, human_size

    assert [human_size(n) for n in (80, 2048, 3 * MiB, 5 * 2**30)] == [
        "80 bytes",
        "2.00 KiB",
        "3.00 MiB",
        "5.00 GiB",
    ]
    assert [human_duration(s) for s in (42, 210, 4320)] == ["42 s", "3.5 min", "1.2 h"]


def test_a_long_list_is_cut_short_one_way_everywhere() -> None:
    from mtpcheck.units import first_few

    names = ["a", "b", "c", "d", "e"]
    assert first_few(names, 3) == "a, b, c and 2 more"
    assert first_few(names, 3, counted=False) == "a, b, c ..."
    assert first_few(names, 5) == first_few(names, 5, counted=False) == "a, b, c, d, e"
    assert first_few([1, 2], 1) == "1 and 1 more"


def test_converters_report_progress(monkeypatch, tmp_path) -> None:
    from mtpcheck.convert.builtin import hf_to_megatron, megatron_to_hf
    from mtpcheck.formats import open_checkpoint

    monkeypatch.setenv("MTPCHECK_PROGRESS_INTERVAL", "0")
    lines: list[str] = []
    hf = open_checkpoint(FIXTURES / "mimo")
    out = hf_to_megatron(hf, tmp_path / "m", durable=False, log=lines.append)
    assert lines[0].startswith("writing Megatron: ") and " of 19.00 KiB (" in lines[0]
    assert lines[-1].startswith("writing Megatron: 28 tensors, 19.00 KiB in ")
    lines.clear()
    config = json.loads((FIXTURES / "mimo" / "config.json").read_text())
    megatron_to_hf(open_checkpoint(out), tmp_path / "h", config, durable=False, log=lines.append)
    assert lines[-1].startswith("writing HF: 43 tensors, ")
    assert all(line.startswith("writing HF: ") for line in lines) and len(lines) > 2
