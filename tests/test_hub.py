"""``inspect`` / ``diff`` of Hub repositories, against a local server that speaks the Hub's
resolve and tree endpoints (tests/hub_server.py): same verdicts as on the local copy, only
header bytes fetched, clear one-line errors."""

from __future__ import annotations

import json
import logging
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mtpcheck import CheckName
from mtpcheck.formats.hub_ref import HubRef, parse_ref
from tests import checkpoint_edits as edits
from tests.checkpoint_edits import SHARD1, SHARD2
from tests.conftest import FAMILY_FIXTURES, FIXTURES, flip_bit
from tests.hub_server import FakeHub, HubServer
from tests.test_families_2026 import FAMILIES_2026

ALL_FIXTURES = (*FAMILY_FIXTURES, *FAMILIES_2026)


@pytest.fixture(scope="module")
def hub() -> Any:
    fake = FakeHub()
    for name in ALL_FIXTURES:
        fake.add(f"org/{name}", FIXTURES / name)
    with HubServer(fake) as url:
        fake.url = url  # type: ignore[attr-defined]
        yield fake


@pytest.fixture
def online(hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    """The fake Hub as HF_ENDPOINT, a fresh cache, and a working directory that must stay
    empty (nothing is written outside the cache)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_ENDPOINT", hub.url)  # type: ignore[attr-defined]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    hub.clear()
    hub.gated.clear()
    hub.failures.clear()
    hub.failure_status, hub.latency = 503, 0.0
    logging.disable(logging.WARNING)  # as the CLI's main() does: library log records stay off
    try:
        yield hub
    finally:
        logging.disable(logging.NOTSET)
    assert list((tmp_path / "cwd").iterdir()) == []


def _header_end(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def _report(run: Any) -> dict[str, Any]:
    return json.loads(run.stdout)


def _findings(report: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    return {
        c["name"]: [(f["status"], f["message"]) for f in c["findings"]] for c in report["checks"]
    }


def _ranges(hub: FakeHub, repo_folder: Path) -> list[tuple[str, int, int]]:
    """(file, first, last) of every range GET of a safetensors file."""
    out = []
    for r in hub.log:
        if r.method == "GET" and r.path.endswith(".safetensors"):
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", r.range or "")
            assert m, f"a GET without a byte range: {r.path}"
            out.append((r.path.rsplit("/", 1)[1], int(m.group(1)), int(m.group(2))))
    return out


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_hub_inspect_gives_the_local_verdict_from_headers_alone(
    run_cli, online: FakeHub, name: str
) -> None:
    local = run_cli("inspect", FIXTURES / name, "--format", "json")
    remote = run_cli("inspect", f"hf://org/{name}", "--format", "json")
    assert remote.exit_code == local.exit_code, remote.stderr
    a, b = _findings(_report(local)), _findings(_report(remote))
    for check in (CheckName.FAMILY, CheckName.MTP_COUNT, CheckName.MTP_LAYERS):
        assert b[check] == a[check], check
    copies = [s for s, _ in b["shared-copies"]]
    assert all(s == "skip" for s in copies)  # copies need bytes: skipped, with the reason
    # every byte fetched of a weights file lies inside its header
    for file, first, last in _ranges(online, FIXTURES / name):
        assert last < _header_end(FIXTURES / name / file), (file, first, last)
    headers = sum(_header_end(p) for p in (FIXTURES / name).glob("*.safetensors"))
    small = sum(p.stat().st_size for p in (FIXTURES / name).glob("*.json"))
    tree = sum(r.body_bytes for r in online.log if "/api/models/" in r.path)
    assert online.fetched("GET") <= headers + small + tree
    said = remote.stderr.strip().splitlines()[-1]
    assert said.startswith(f"mtpcheck: hf://org/{name}: fetched ") and "no tensor bytes" in said
    assert f" in {len(online.log)} requests " in said  # what it says is what the server saw


def test_fetch_compares_shared_copies_by_range_reads(
    run_cli, online: FakeHub, tmp_path: Path
) -> None:
    run = run_cli("inspect", "hf://org/deepseek_v3", "--fetch", "--format", "json")
    assert run.exit_code == 0
    copies = _findings(_report(run))[CheckName.SHARED_COPIES]
    assert copies == [
        ("pass", "bit-identical to model.embed_tokens.weight (2048 bytes)"),
        ("pass", "bit-identical to lm_head.weight (2048 bytes)"),
    ]
    assert _findings(_report(run))[CheckName.MTP_TRAINED] == [
        ("pass", "looks trained (7 norms, 1 block(s) checked)")
    ]
    from mtpcheck.formats import open_checkpoint

    local = open_checkpoint(FIXTURES / "deepseek_v3")
    pairs = ("model.embed_tokens.weight", "lm_head.weight", "model.layers.2.embed_tokens.weight")
    pairs += ("model.layers.2.shared_head.head.weight",)
    copies = read = 0
    for file, first, last in _ranges(online, FIXTURES / "deepseek_v3"):
        if first < 8:
            continue
        header = _header_end(FIXTURES / "deepseek_v3" / file)
        if last < header:
            continue  # the header itself
        owner = next(
            (n, m)
            for n, m in local.tensors.items()
            if Path(m.file).name == file and m.offset <= first and last < m.offset + m.nbytes
        )
        read += last - first + 1
        if owner[0] in pairs:
            copies += last - first + 1
        elif not owner[0].startswith("model.layers.2."):  # a main tensor: only its prefix
            assert last - owner[1].offset < 4096, owner[0]
    assert copies == 4 * 2048  # the two pairs of tensors, each read once
    assert read > copies  # mtp-trained read the MTP layer and main-layer prefixes too


def test_a_damaged_copy_is_found_by_range_reads(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path
) -> None:
    from mtpcheck.formats import open_checkpoint

    damaged = tmp_path / "damaged"
    shutil.copytree(FIXTURES / "deepseek_v3", damaged)
    meta = open_checkpoint(damaged).tensors["model.layers.2.shared_head.head.weight"]
    flip_bit(Path(meta.file), meta.offset + 10, bit=1)
    hub.add("org/damaged", damaged)
    quiet = run_cli("inspect", "hf://org/damaged", "--format", "json")
    assert quiet.exit_code == 0  # by headers alone the damage cannot be seen
    run = run_cli("inspect", "hf://org/damaged", "--fetch", "--format", "json")
    assert run.exit_code == 1
    [_, (status, message)] = _findings(_report(run))[CheckName.SHARED_COPIES]
    assert status == "fail" and message.startswith("diverged from lm_head.weight: bits differ")


def test_hub_diff_proves_identity_by_file_hashes_and_bytes_by_range(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path
) -> None:
    from mtpcheck.formats import open_checkpoint

    changed = tmp_path / "changed"
    shutil.copytree(FIXTURES / "deepseek_v3", changed)
    meta = open_checkpoint(changed).tensors["model.layers.2.eh_proj.weight"]
    flip_bit(Path(meta.file), meta.offset + 6, bit=2)
    hub.add("org/changed", changed)
    same = run_cli("diff", "hf://org/deepseek_v3", "hf://org/deepseek_v3", "--format", "json")
    assert same.exit_code == 0
    statuses = {t["status"] for t in _report(same)["tensors"]}
    assert statuses == {"equal"}  # LFS sha256 of the files: equal without a tensor byte
    assert all(
        a < 8 or b < _header_end(FIXTURES / "deepseek_v3" / f)
        for f, a, b in _ranges(online, FIXTURES / "deepseek_v3")
    )

    headers = run_cli("diff", "hf://org/deepseek_v3", "hf://org/changed", "--format", "json")
    assert headers.exit_code == 0
    by_status: dict[str, set[str]] = {}
    for t in _report(headers)["tensors"]:
        by_status.setdefault(t["status"], set()).add(t["name"])
    changed_file = Path(meta.file).name
    in_changed = {
        n for n, m in open_checkpoint(changed).tensors.items() if Path(m.file).name == changed_file
    }
    assert by_status["not_compared"] == in_changed & set().union(*by_status.values())
    assert "model.layers.2.eh_proj.weight" in by_status["not_compared"]

    online.clear()
    fetched = run_cli(
        "diff", "hf://org/deepseek_v3", "hf://org/changed", "--fetch", "--format", "json"
    )
    # with --fetch, only the tensors of the file whose hash differs are read, one request each
    past_headers = [
        (f, a, b) for f, a, b in _ranges(online, changed) if a >= _header_end(changed / f)
    ]
    assert len(past_headers) == 2 * len(by_status["not_compared"])
    assert fetched.exit_code == 1
    bad = [t for t in _report(fetched)["tensors"] if t["status"] != "equal"]
    assert [(t["name"], t["status"], t["differing_elements"]) for t in bad] == [
        ("model.layers.2.eh_proj.weight", "bits_differ", 1)
    ]


def test_mixed_local_and_hub_diff(run_cli, online: FakeHub) -> None:
    run = run_cli("diff", FIXTURES / "glm4_moe", "hf://org/glm4_moe", "--fetch", "--format", "json")
    assert run.exit_code == 0
    assert {t["status"] for t in _report(run)["tensors"]} == {"equal"}
    headers = run_cli("diff", FIXTURES / "glm4_moe", "hf://org/glm4_moe", "--format", "json")
    assert headers.exit_code == 0
    assert {t["status"] for t in _report(headers)["tensors"]} == {"not_compared"}


@pytest.mark.parametrize(
    ("target", "setup", "message"),
    [
        ("hf://nobody/absent", None, "repository not found, or private: check the name"),
        ("hf://org/mimo@v9.9", None, "revision 'v9.9' does not exist"),
        ("hf://org/gated", "gated", "gated repository: request access on its Hub page"),
        ("hf://org/config-only", "config-only", "no safetensors weights in the repository"),
    ],
)
def test_hub_errors_are_one_line(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path, target: str, setup: str | None,
    message: str,
) -> None:  # fmt: skip
    if setup == "gated":
        hub.add("org/gated", FIXTURES / "mimo")
        online.gated.add("org/gated")
    elif setup == "config-only":
        (tmp_path / "co").mkdir()
        shutil.copy(FIXTURES / "mimo" / "config.json", tmp_path / "co")
        hub.add("org/config-only", tmp_path / "co")
    run = run_cli("inspect", target)
    assert run.exit_code == 2
    assert run.stdout == ""
    [line] = run.stderr.splitlines()
    assert line.startswith(f"mtpcheck: error: {target}: {message}"), line


def test_transient_server_errors_are_retried(run_cli, online: FakeHub, monkeypatch) -> None:
    from mtpcheck.formats import hub as hub_module

    monkeypatch.setattr(hub_module, "BACKOFF_S", 0.01)
    online.failures["model-00001-of-00002.safetensors"] = 2
    run = run_cli("inspect", "hf://org/deepseek_v3")
    assert run.exit_code == 0, run.stderr
    assert sum(r.status == 503 for r in online.log) == 2
    online.clear()
    online.failures["model-00001-of-00002.safetensors"] = 100
    run = run_cli("inspect", "hf://org/deepseek_v3")
    assert run.exit_code == 2
    [line] = run.stderr.splitlines()
    assert line == (
        f"mtpcheck: error: hf://org/deepseek_v3: HTTP 503 from {online.url} after "  # type: ignore[attr-defined]
        f"{hub_module.RETRIES} retries"
    )
    assert sum(r.status == 503 for r in online.log) == hub_module.RETRIES + 1


def test_rate_limits_and_time_outs_end_in_one_line(run_cli, online: FakeHub, monkeypatch) -> None:
    from mtpcheck.formats import hub as hub_module

    monkeypatch.setattr(hub_module, "BACKOFF_S", 0.01)
    online.failure_status = 429
    online.failures["/revision/main"] = 100
    run = run_cli("inspect", "hf://org/mimo")
    assert run.exit_code == 2
    assert run.stderr.splitlines() == [
        f"mtpcheck: error: hf://org/mimo: HTTP 429 (rate limited) from {online.url} after "  # type: ignore[attr-defined]
        f"{hub_module.RETRIES} retries"
    ]
    online.failures.clear()
    online.latency = 0.5
    monkeypatch.setenv("HF_HUB_DOWNLOAD_TIMEOUT", "0.05")
    run = run_cli("inspect", "hf://org/mimo")
    assert run.exit_code == 2
    [line] = run.stderr.splitlines()
    assert line.startswith(f"mtpcheck: error: hf://org/mimo: cannot reach {online.url}: ")  # type: ignore[attr-defined]
    assert "Timeout" in line


def test_a_truncated_shard_on_the_hub_is_found_from_its_length(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path
) -> None:
    cut = tmp_path / "cut"
    shutil.copytree(FIXTURES / "deepseek_v3", cut)
    shard = cut / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    hub.add("org/cut", cut)
    local = _findings(_report(run_cli("inspect", cut, "--format", "json")))[CheckName.INTEGRITY]
    remote = run_cli("inspect", "hf://org/cut", "--format", "json")
    assert remote.exit_code == 1
    assert _findings(_report(remote))[CheckName.INTEGRITY] == local
    assert local[0][0] == "fail" and "is truncated" in local[0][1]


def test_an_unreachable_hub_is_one_line(run_cli, online: FakeHub, monkeypatch) -> None:
    from mtpcheck.formats import hub as hub_module
    from tests.launch import free_port

    monkeypatch.setattr(hub_module, "BACKOFF_S", 0.01)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    run = run_cli("inspect", "hf://org/mimo")
    assert run.exit_code == 2
    [line] = run.stderr.splitlines()
    assert line.startswith("mtpcheck: error: hf://org/mimo: cannot reach http://127.0.0.1:")


@pytest.mark.parametrize("stray", ["a shard", "garbage"])
def test_an_unindexed_shard_in_the_repository_is_reported(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path, stray: str
) -> None:
    extra = tmp_path / "extra"
    shutil.copytree(FIXTURES / "deepseek_v3", extra)
    if stray == "a shard":
        shutil.copy(FIXTURES / "mimo" / "model.safetensors", extra / "stray.safetensors")
    else:  # not even a header: the index does not name it, so it is not read as one
        (extra / "stray.safetensors").write_bytes(b"\xff" * 64)
    hub.add("org/extra", extra)
    run = run_cli("inspect", "hf://org/extra", "--format", "json")
    assert run.exit_code == 1, run.stderr
    assert ("fail", "stray.safetensors is in the repository but the index does not mention it") in (
        _findings(_report(run))[CheckName.INTEGRITY]
    )


def test_a_shard_the_index_names_and_the_repository_lacks_reads_as_on_disk(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path
) -> None:
    """One rule holds a repository's shards to its index and a folder's: only the words for
    where a shard is differ."""
    lacking = tmp_path / "lacking"
    shutil.copytree(FIXTURES / "deepseek_v3", lacking)
    (lacking / SHARD2).unlink()
    hub.add("org/lacking", lacking)
    local = _findings(_report(run_cli("inspect", str(lacking), "--format", "json")))
    remote = _findings(_report(run_cli("inspect", "hf://org/lacking", "--format", "json")))
    on_disk = "index names shard model-00002-of-00002.safetensors (34 tensors) but "
    assert local[CheckName.INTEGRITY] == [("fail", on_disk + "the file is missing")]
    assert remote[CheckName.INTEGRITY] == [("fail", on_disk + "the repository lacks it")]


def test_an_index_that_maps_nothing_fails_on_the_hub_as_on_disk(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path
) -> None:
    """Loaders read the shards an index names: one naming none loads no weight at all, so the
    shards beside it are not read as shards without an index."""
    empty = tmp_path / "empty"
    shutil.copytree(FIXTURES / "deepseek_v3", empty)
    index = empty / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {}}))
    hub.add("org/empty", empty)
    local = run_cli("inspect", str(empty), "--format", "json")
    remote = run_cli("inspect", "hf://org/empty", "--format", "json")
    assert (local.exit_code, remote.exit_code) == (1, 1), remote.stderr
    shards = (SHARD1, SHARD2)
    unnamed = "{} {} but the index does not mention it"
    assert _findings(_report(local))[CheckName.INTEGRITY] == [
        ("fail", unnamed.format(s, "sits beside the index")) for s in shards
    ]
    assert _findings(_report(remote))[CheckName.INTEGRITY] == [
        ("fail", unnamed.format(s, "is in the repository")) for s in shards
    ]


EMBED = "model.embed_tokens.weight"  # in SHARD1 of deepseek_v3
INDEX_DAMAGE = {
    "a shard missing": edits.unlink(SHARD2),
    "a shard the index does not name": lambda root: shutil.copy(
        FIXTURES / "mimo" / "model.safetensors", root / "stray.safetensors"
    ),
    "an index that maps nothing": edits.set_index(lambda i: i["weight_map"].clear()),
    "a tensor in both shards": edits.tensor_in_both_shards,
    "a tensor placed in the wrong shard": edits.set_index(
        lambda i: i["weight_map"].update({EMBED: SHARD2})
    ),
    "a tensor no shard holds": edits.set_index(
        lambda i: i["weight_map"].update({"model.ghost.weight": SHARD1})
    ),
    "a tensor the index leaves out": edits.set_index(lambda i: i["weight_map"].pop(EMBED)),
    "a truncated shard": edits.truncate(SHARD2, -100),
}


@pytest.mark.parametrize("damage", INDEX_DAMAGE)
def test_the_hub_holds_shards_to_their_index_as_on_disk(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path, damage: str
) -> None:
    """Each way an index and its shards can disagree is found in a repository as in its local
    copy, in the same words but for where a shard is."""
    root = Path(shutil.copytree(FIXTURES / "deepseek_v3", tmp_path / "damaged"))
    INDEX_DAMAGE[damage](root)
    hub.add("org/damaged", root)
    local = run_cli("inspect", str(root), "--format", "json")
    remote = run_cli("inspect", "hf://org/damaged", "--format", "json")
    assert (local.exit_code, remote.exit_code) == (1, 1), remote.stderr
    found = _findings(_report(local))[CheckName.INTEGRITY]
    assert found and all(status == "fail" for status, _ in found)
    on_disk = [
        (status, message.replace("the repository lacks it", "the file is missing"))
        for status, message in _findings(_report(remote))[CheckName.INTEGRITY]
    ]
    assert [
        (status, message.replace("is in the repository", "sits beside the index"))
        for status, message in on_disk
    ] == found


def test_shards_without_an_index_holding_a_tensor_twice(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path
) -> None:
    twice = tmp_path / "twice"
    twice.mkdir()
    shutil.copy(FIXTURES / "mimo" / "config.json", twice)
    for name in ("model-a.safetensors", "model-b.safetensors"):
        shutil.copy(FIXTURES / "mimo" / "model.safetensors", twice / name)
    hub.add("org/twice", twice)
    local = _findings(_report(run_cli("inspect", twice, "--format", "json")))[CheckName.INTEGRITY]
    remote = run_cli("inspect", "hf://org/twice", "--format", "json")
    assert remote.exit_code == 1
    assert _findings(_report(remote))[CheckName.INTEGRITY] == local
    assert local[0] == (
        "fail",
        "lm_head.weight is stored in model-a.safetensors and model-b.safetensors",
    )


def test_offline_mode_reads_only_the_cache(run_cli, online: FakeHub, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = run_cli("inspect", "hf://org/mimo")
    assert run.exit_code == 2
    assert run.stderr.startswith(
        "mtpcheck: error: hf://org/mimo: HF_HUB_OFFLINE is set and the repository is not in "
        "the cache"
    )
    assert online.log == []  # not one request


def test_references() -> None:
    assert parse_ref("hf://deepseek-ai/DeepSeek-V3@main") == HubRef(
        "deepseek-ai/DeepSeek-V3", "main"
    )
    assert parse_ref("hf://org/name") == HubRef("org/name")
    assert parse_ref("some-org/some-model") == HubRef("some-org/some-model", bare=True)
    assert parse_ref(str(FIXTURES / "mimo")) is None  # a local path
    for bad in ("hf://justname", "hf://a/b/c", "hf://org/name@", "hf://../x"):
        with pytest.raises(Exception, match="expected hf://ORG/NAME"):
            parse_ref(bad)


def test_the_installed_command_reads_its_endpoint_and_cache_from_the_environment(
    hub: FakeHub, tmp_path: Path
) -> None:
    """End to end, as a user runs it: HF_ENDPOINT and HF_HUB_CACHE from the environment, the
    library's retry warnings kept off stderr, one line for a failure."""
    from tests.launch import child_env

    env = {**child_env(), "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path / "c")}  # type: ignore[attr-defined]
    env.pop("HF_HUB_OFFLINE", None)
    ok = subprocess.run(
        [sys.executable, "-m", "mtpcheck", "inspect", "org/mimo", "--format", "json"],
        capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["inputs"][0]["path"] == "hf://org/mimo"
    assert (tmp_path / "c").is_dir()  # the cache it was given, and nothing else
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    hub.gated.add("org/mimo")
    try:
        gated = subprocess.run(
            [sys.executable, "-m", "mtpcheck", "inspect", "hf://org/mimo"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
    finally:
        hub.gated.discard("org/mimo")
    assert gated.returncode == 2 and gated.stdout == ""
    assert gated.stderr.splitlines() == [
        "mtpcheck: error: hf://org/mimo: gated repository: request access on its Hub page, "
        "then log in (`hf auth login`) or set HF_TOKEN"
    ]


def test_a_mistyped_local_path_is_not_a_silent_hub_lookup(run_cli, online: FakeHub) -> None:
    run = run_cli("inspect", "checkpints/model")  # meant checkpoints/model, which exists nowhere
    assert run.exit_code == 2
    assert run.stderr.splitlines() == [
        "mtpcheck: error: hf://checkpints/model: repository not found, or private: check the "
        "name, and log in (`hf auth login`) or set HF_TOKEN if it is private (read as a Hub "
        "repository: no local path checkpints/model exists)"
    ]


def test_hub_inspect_imports_no_torch(hub: FakeHub, tmp_path: Path) -> None:
    from tests.launch import child_env

    env = {**child_env(), "HF_ENDPOINT": hub.url, "HF_HUB_CACHE": str(tmp_path)}  # type: ignore[attr-defined]
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "mtpcheck", "inspect", "hf://org/deepseek_v3"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in run.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    assert "huggingface_hub" in imported  # the check can see a heavy import when there is one
    assert not imported & {"torch", "transformers", "megatron", "numpy", "safetensors"}


def test_a_repository_short_of_a_main_layer_fails_from_its_headers(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path
) -> None:
    """An export that lost a decoder layer, its index rebuilt to match: by headers alone,
    no tensor byte downloaded, the main model is short of what its config declares."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    short = Path(shutil.copytree(FIXTURES / "qwen3_5_text", tmp_path / "short"))
    for shard in short.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as f:
            metadata = f.metadata()
        tensors = load_file(str(shard))
        kept = {n: t for n, t in tensors.items() if not n.startswith("model.layers.0.")}
        save_file(kept, str(shard), metadata=metadata)
    index = short / "model.safetensors.index.json"
    if index.exists():
        content = json.loads(index.read_text())
        content["weight_map"] = {
            n: f for n, f in content["weight_map"].items() if not n.startswith("model.layers.0.")
        }
        index.write_text(json.dumps(content))
    hub.add("org/short", short)
    run = run_cli("inspect", "hf://org/short", "--format", "json")
    assert run.exit_code == 1, run
    assert _findings(_report(run))[CheckName.MAIN_MODEL] == [
        ("fail", "all 14 tensors missing (as main layer 1 of its kind holds them)")
    ]
    assert "no tensor bytes" in run.stderr.strip().splitlines()[-1]


def _tiny_shard(path: Path, name: str) -> None:
    """A safetensors file of one F32 scalar ``name``."""
    header = json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0\0\0")


def test_shard_headers_are_read_concurrently_within_the_bound_and_once_each(
    run_cli, hub: FakeHub, online: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers are read several at a time, never more than ``CONCURRENCY`` requests in
    flight, and nothing is fetched twice: each shard's length and header once, the config and
    the index once each."""
    from mtpcheck.formats import hub as hub_module

    many = Path(shutil.copytree(FIXTURES / "deepseek_v3", tmp_path / "many"))
    for k in range(12):
        _tiny_shard(many / f"extra-{k:02d}.safetensors", f"extra.{k}.weight")
    hub.add("org/many", many)
    monkeypatch.setattr(hub_module, "CONCURRENCY", 3)
    online.latency = 0.02  # requests overlap only if the client sends them together
    run = run_cli("inspect", "hf://org/many", "--format", "json")
    assert run.exit_code == 1, run.stderr  # the extra shards are not in the index
    assert 2 <= online.peak_in_flight <= 3
    gets = [(r.path, r.range) for r in online.log if r.method == "GET"]
    assert len(gets) == len(set(gets))
    shards = sorted(p.name for p in many.glob("*.safetensors"))
    read = sorted(file for file, first, _ in _ranges(online, many) if first == 0)
    assert read == shards  # every shard's length, once
    assert len(_ranges(online, many)) == 2 * len(shards)  # and then its header, once
    assert sum(p.endswith(("/config.json", "/model.safetensors.index.json")) for p, _ in gets) == 2
