"""Shared helpers: fixture copies, a torch-free safetensors writer, a CLI runner."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from mtpcheck.cli import cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
FAMILY_FIXTURES = ("deepseek_v3", "glm4_moe", "glm_moe_dsa", "qwen3_next", "mimo")


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """Write a safetensors file from raw bytes, in name order, without torch."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in sorted(tensors):
            f.write(tensors[name][2])


@pytest.fixture
def fixture_copy(tmp_path: Path) -> Callable[[str], Path]:
    """Copy a shipped fixture into tmp_path so a test can damage it."""

    def copy(name: str) -> Path:
        dst = tmp_path / name
        shutil.copytree(FIXTURES / name, dst)
        return dst

    return copy


@dataclass
class Run:
    exit_code: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return f"exit {self.exit_code}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


@pytest.fixture(scope="session")
def run_cli() -> Callable[..., Run]:
    """Invoke the CLI in-process; returns exit code, stdout and stderr separately."""

    def run(*args: str | Path) -> Run:
        argv = [str(a) for a in args]
        result = CliRunner().invoke(cli, argv, catch_exceptions=False)
        if "--format" in argv and argv[argv.index("--format") + 1 :][:1] == ["json"]:
            if result.stdout.strip():
                check_report_schema(result.stdout)  # every JSON report of the suite, checked
        return Run(result.exit_code, result.stdout, result.stderr)

    return run


PEAK = """
def peak_kib():
    # this process's own peak resident memory, in KiB: VmHWM of the memory map exec made
    # (getrusage's ru_maxrss keeps the forking parent's peak across exec)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
"""
"""Python source defining ``peak_kib()``, for a child process to report its own peak."""


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    """Flip one bit of the byte at ``offset`` in ``path``, in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def findings_of(
    report: dict[str, Any], status: str, check: str | None = None
) -> list[tuple[str, str]]:
    """(subject, message) of the findings of ``status`` in a JSON report, of ``check`` only
    where one is named."""
    return [
        (f["subject"], f["message"])
        for c in report["checks"]
        for f in c["findings"]
        if f["status"] == status and check in (None, c["name"])
    ]


def tensor_offset(shard: Path, name: str) -> int:
    """The file offset of tensor ``name``'s first byte in a safetensors file."""
    raw = shard.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    return 8 + size + json.loads(raw[8 : 8 + size])[name]["data_offsets"][0]


# --- the quick loop: `-m "not slow and not heavy"` -------------------------------------------

HEAVY_MODULES = frozenset(
    {
        # torchrun ranks: several interpreters importing torch and megatron-core each
        "test_distributed_diff",
        "test_distributed_roundtrip",
        # real megatron-core models built, saved or loaded on CPU
        "test_megatron_readers",
        "test_glm5_convert",
        "test_qwen3_next_convert",
        "test_torch_dist_writer",
        # whole round trips, trained drafters decoded, fresh interpreters with torch
        "test_roundtrip",
        "test_accept_engine_rule",
        "test_accept_qwen3_next",
        "test_accept_device_map",
        "test_damage_campaign",
        "test_torch_threads",
    }
)
"""Modules of the default tier left out of the developer's quick loop: together about half of
its time (docs/development.md). README's command and CI run them."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heavy = pytest.mark.heavy
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in HEAVY_MODULES:
            item.add_marker(heavy)


# --- third-party round trips: started once collection shows a test needs them ----------------

THIRDPARTY_FIXTURE = "thirdparty_runs"
_THIRDPARTY_KEY = pytest.StashKey[object]()


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(THIRDPARTY_FIXTURE in getattr(item, "fixturenames", ()) for item in session.items):
        from tests.thirdparty.runs import Roundtrips

        session.config.stash[_THIRDPARTY_KEY] = Roundtrips()


def pytest_unconfigure(config: pytest.Config) -> None:
    runs = config.stash.get(_THIRDPARTY_KEY, None)
    if runs is not None:
        runs.close()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def thirdparty_runs(request: pytest.FixtureRequest) -> object:
    """The :class:`tests.thirdparty.runs.Roundtrips` started after collection."""
    return request.config.stash[_THIRDPARTY_KEY]


# --- every JSON report a test produces is checked against the shipped schema ------------------

_SCHEMA = json.loads(
    (Path(__file__).resolve().parent.parent / "src/mtpcheck/report/report.schema.json").read_text()
)


def check_report_schema(stdout: str) -> None:
    """Validate a ``--format json`` stdout against ``report.schema.json`` (raises if not)."""
    import jsonschema

    jsonschema.validate(json.loads(stdout), _SCHEMA, cls=jsonschema.Draft202012Validator)
