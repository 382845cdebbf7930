"""A drafter and its target on the Hub (the local stand-in, ``tests/hub_server.py``): headers
first; tensor bytes only for the comparisons that need them, and only with ``--fetch``."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from tests.hub_server import FakeHub, HubServer

DATA = Path(__file__).resolve().parent / "data" / "speculators"
CASES = ("llama-target", "eagle3", "eagle3-random-embed")


@pytest.fixture(scope="module")
def hub() -> Iterator[FakeHub]:
    fake = FakeHub()
    for name in CASES:
        fake.add(f"org/{name}", DATA / name)
    with HubServer(fake) as url:
        fake.url = url  # type: ignore[attr-defined]
        yield fake


@pytest.fixture
def online(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", hub.url)  # type: ignore[attr-defined]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    hub.clear()
    logging.disable(logging.WARNING)
    try:
        yield hub
    finally:
        logging.disable(logging.NOTSET)


def _findings(run: Any, check: str) -> list[tuple[str, str, str]]:
    report = json.loads(run.stdout)
    found = next(c for c in report["checks"] if c["name"] == check)
    return [(f["status"], f["subject"], f["message"]) for f in found["findings"]]


def _tensor_bytes(hub: FakeHub) -> int:
    """Bytes of tensor data fetched: every range GET that reaches past its file's header."""
    fetched = 0
    for r in hub.log:
        m = re.fullmatch(r"bytes=(\d+)-(\d+)", r.range or "")
        if r.method == "GET" and r.path.endswith(".safetensors") and m:
            repo = r.path.split("/")[2]
            shard = DATA / repo / r.path.rsplit("/", 1)[1]
            with open(shard, "rb") as f:
                end = 8 + int.from_bytes(f.read(8), "little")
            fetched += max(0, int(m.group(2)) + 1 - max(end, int(m.group(1))))
    return fetched


def test_headers_alone_judge_the_pair_and_say_what_needs_bytes(run_cli, online) -> None:
    run = run_cli(
        "inspect", "hf://org/eagle3", "--target", "hf://org/llama-target", "--format", "json"
    )
    assert run.exit_code == 0, run.stderr
    assert _findings(run, CheckName.PAIRING_SHAPE)[0] == (
        "pass",
        "vocabulary",
        "256, as the target's",
    )
    [(status, subject, message)] = _findings(run, CheckName.DRAFTER_VOCAB)
    assert (status, subject) == ("skip", "d2t") and message.startswith("values not read: ")
    assert _findings(run, CheckName.PAIRING_EMBEDDING)[0] == (
        "skip",
        "embed_tokens.weight",
        "not compared: bytes not at hand (--fetch reads them)",
    )
    assert _tensor_bytes(online) == 0


def test_with_fetch_the_bytes_a_comparison_needs_are_read(run_cli, online) -> None:
    run = run_cli(
        "inspect",
        "hf://org/eagle3-random-embed",
        "--target",
        "hf://org/llama-target",
        "--fetch",
        "--format",
        "json",
    )
    assert run.exit_code == 1, run.stderr
    [embedding, _] = _findings(run, CheckName.PAIRING_EMBEDDING)
    assert embedding[:2] == ("fail", "embed_tokens.weight")
    assert _findings(run, CheckName.DRAFTER_VOCAB)[0][0] == "pass"
    # the maps (128 x 8 + 256 bytes) and both embeddings (2 x 65536), nothing else
    assert 0 < _tensor_bytes(online) <= 128 * 8 + 256 + 2 * 256 * 64 * 4


def test_a_local_drafter_against_a_hub_target(run_cli, online) -> None:
    run = run_cli(
        "inspect",
        DATA / "eagle3",
        "--target",
        "hf://org/llama-target",
        "--fetch",
        "--format",
        "json",
    )
    assert run.exit_code == 0, run.stderr
    assert _findings(run, CheckName.PAIRING_EMBEDDING)[0] == (
        "pass",
        "embed_tokens.weight",
        "an identical copy of the target's (65536 bytes)",
    )
