"""A Hugging Face Hub repository audited where it lies: headers by HTTP range, no weights.

``hf://ORG/NAME[@REVISION]`` (or a bare ``ORG/NAME`` no local path of that name exists for).
One repository-information request gives the commit, the file list, sizes and LFS sha256;
``config.json`` and the index come through huggingface_hub (its cache, token, ``HF_ENDPOINT``);
each shard's header is read with two range requests (its 8-byte length, then exactly the
header, so that no tensor byte is fetched), :data:`CONCURRENCY` shards at a time. Nothing is
written outside the huggingface_hub cache. Tensor bytes are read by range only where the
caller allows it. With ``HF_HUB_OFFLINE=1`` the cached snapshot is opened as a local
checkpoint.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from mtpcheck.errors import HeaderError, InputError, shown
from mtpcheck.formats.config_json import read_config
from mtpcheck.formats.hf_safetensors import INDEX_SUFFIX, HfSafetensorsReader, read_index
from mtpcheck.formats.hub_ref import HubRef
from mtpcheck.formats.safetensors_header import ShardHeader, parse_header_bytes
from mtpcheck.formats.safetensors_shards import (
    ShardPlace,
    cross_checked,
    shard_tensors,
    written_as,
)
from mtpcheck.model import Checkpoint, CheckpointData, Naming, files_of
from mtpcheck.units import human_size

MAX_HEADER_BYTES = 100 * 2**20
CONCURRENCY = 16
PREFETCH_MAX_BYTES = 64 * 2**20
"""Larger tensors are streamed by sequential range reads, in bounded memory."""
RETRIES = 4
BACKOFF_S = 0.5
INDEX_FILE = "model" + INDEX_SUFFIX
SINGLE_FILE = "model.safetensors"
_IN_THE_REPOSITORY = ShardPlace(absent="the repository lacks it", present="is in the repository")


@dataclass
class Traffic:
    """What was fetched from the Hub (thread-safe counters)."""

    requests: int = 0
    bytes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, nbytes: int, requests: int = 1) -> None:
        """Count ``requests`` more requests that fetched ``nbytes`` bytes."""
        with self.lock:
            self.requests += requests
            self.bytes += nbytes


@dataclass(frozen=True)
class RemoteFile:
    """A file of the repository at the pinned commit, as the Hub lists it."""

    name: str
    size: int
    sha256: str | None
    """The LFS object id (sha256 of the whole file), when the Hub stores it in LFS."""


@dataclass(frozen=True)
class HubCheckpoint(CheckpointData):
    """A Hub repository's safetensors checkpoint, known from its headers."""

    ref: HubRef
    commit: str
    files: Mapping[str, RemoteFile]
    client: _Client = field(repr=False, compare=False)
    fetch_bytes: bool = False
    written_as: frozenset[str] = frozenset()
    """The ``format`` each shard's ``__metadata__`` records (``pt``, ``mlx``)."""
    cross_checked: str = "headers"
    format: str = "hf-hub"
    naming: Naming = Naming.HF
    _prefetched: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    @property
    def why_no_bytes(self) -> str:
        """Why tensor bytes cannot be compared (empty when range reads are allowed)."""
        if self.fetch_bytes:
            return ""
        return "a Hub repository is read by its headers only (--fetch reads tensors by range)"

    def file_sha256(self, file: str) -> str | None:
        """The LFS sha256 the Hub lists for the tensor file ``file``; None when it lists none."""
        remote = self.files.get(Path(file).name)
        return remote.sha256 if remote else None

    def prefetch(self, names: Iterable[str]) -> None:
        """Read the bytes of the tensors ``names`` (those up to :data:`PREFETCH_MAX_BYTES`)
        concurrently, one range request each, ahead of :meth:`read_chunks`; the comparison
        then waits on one round trip a batch, not one a tensor."""
        if not self.fetch_bytes:
            return
        wanted = [
            n
            for n in dict.fromkeys(names)
            if n in self.tensors
            and n not in self._prefetched
            and 0 < self.tensors[n].nbytes <= PREFETCH_MAX_BYTES
        ]

        def fetch(name: str) -> tuple[str, bytes]:
            meta = self.tensors[name]
            return name, self.client.range(Path(meta.file).name, meta.offset, meta.nbytes)

        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            self._prefetched.update(pool.map(fetch, wanted))

    def read_chunks(self, name: str, chunk_bytes: int) -> Iterator[bytes]:
        """The tensor's bytes by range requests (prefetched ones from memory); an
        :class:`InputError` unless ``--fetch`` allowed reading bytes."""
        if not self.fetch_bytes:
            raise InputError(str(self.ref), self.why_no_bytes)
        meta = self.tensors[name]
        held = self._prefetched.pop(name, None)  # read once: memory is released as it goes
        if held is not None:
            for start in range(0, len(held), chunk_bytes):
                yield held[start : start + chunk_bytes]
            return
        done = 0
        while done < meta.nbytes:
            size = min(chunk_bytes, meta.nbytes - done)
            yield self.client.range(Path(meta.file).name, meta.offset + done, size)
            done += size


class _Client:
    """HTTP to one repository at one commit, through huggingface_hub."""

    def __init__(self, ref: HubRef, endpoint: str, traffic: Traffic) -> None:
        self.ref, self.endpoint, self.traffic = ref, endpoint, traffic
        self.revision = ref.revision or "main"
        self._urls: dict[tuple[str, str], str] = {}
        self._headers: dict[str, str] | None = None

    def pin(self, commit: str) -> None:
        self.revision = commit

    def url(self, filename: str) -> str:
        """The file's resolve URL at the client's revision (worked out once a file: each
        shard is asked for twice)."""
        key = (filename, self.revision)
        found = self._urls.get(key)
        if found is None:
            from huggingface_hub import hf_hub_url

            found = self._urls[key] = hf_hub_url(
                self.ref.repo, filename, revision=self.revision, endpoint=self.endpoint
            )
        return found

    def hf_headers(self) -> dict[str, str]:
        """huggingface_hub's headers (user agent, token), built once: building them reads the
        token from the environment or its file, each of ~330 requests would again."""
        if self._headers is None:
            from huggingface_hub.utils import build_hf_headers

            self._headers = build_hf_headers()
        return self._headers

    def download(self, filename: str) -> Path:
        """A small file through huggingface_hub's cache (config.json, the index)."""
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        before = try_to_load_from_cache(self.ref.repo, filename, revision=self.revision)
        local = hf_hub_download(
            self.ref.repo, filename, revision=self.revision, endpoint=self.endpoint
        )
        path = Path(local)
        cached = isinstance(before, str) and Path(before).resolve() == path.resolve()
        # a HEAD request either way; the GET only when the cache did not hold the file
        if cached:
            self.traffic.add(0, requests=1)
        else:
            self.traffic.add(path.stat().st_size, requests=2)
        return path

    def get(self, url: str, headers: dict[str, str]) -> Any:
        """GET with retries and back-off on time-outs, network errors, 429 and 5xx."""
        from huggingface_hub.utils import hf_raise_for_status, http_backoff

        response = http_backoff(
            "GET",
            url,
            headers={**self.hf_headers(), **headers},
            max_retries=RETRIES,
            base_wait_time=BACKOFF_S,
            max_wait_time=8 * BACKOFF_S,
            follow_redirects=True,
            timeout=_timeout(),
        )
        hf_raise_for_status(response)
        self.traffic.add(len(response.content))
        return response

    def files(self) -> tuple[str, dict[str, RemoteFile]]:
        """The commit the revision points at, and the repository's files (one request)."""
        url = f"{self.endpoint}/api/models/{self.ref.repo}/revision/{quote(self.revision, safe='')}"
        info = self.get(url + "?blobs=true", {}).json()
        commit = info.get("sha") if isinstance(info, dict) else None
        siblings = info.get("siblings") if isinstance(info, dict) else None
        if not isinstance(commit, str) or not isinstance(siblings, list):
            raise InputError(str(self.ref), "the Hub's repository information has no commit")
        files = {}
        for item in siblings:
            name = item.get("rfilename") if isinstance(item, dict) else None
            if isinstance(name, str) and "/" not in name:
                lfs = item.get("lfs") if isinstance(item.get("lfs"), dict) else {}
                sha = lfs.get("sha256") if isinstance(lfs.get("sha256"), str) else None
                files[name] = RemoteFile(name, int(item.get("size") or 0), sha)
        return commit, files

    def range(self, filename: str, start: int, size: int) -> bytes:
        data, _ = self.range_with_total(filename, start, size)
        return data

    def range_with_total(self, filename: str, start: int, size: int) -> tuple[bytes, int]:
        """``size`` bytes of ``filename`` from ``start`` (fewer at its end) and its length."""
        headers = {"Range": f"bytes={start}-{start + size - 1}", "Accept-Encoding": "identity"}
        response = self.get(self.url(filename), headers)
        if response.status_code != 206:
            raise InputError(f"{self.ref}/{filename}", "the server ignored the Range request")
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        if not total.isdigit():
            raise InputError(f"{self.ref}/{filename}", "no file length in Content-Range")
        return response.content[:size], int(total)


def _timeout() -> float:
    try:
        return float(os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT", "10"))
    except ValueError:
        return 10.0


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def _endpoint() -> str:
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def open_hub(
    ref: HubRef,
    fetch_bytes: bool = False,
    log: Callable[[str], None] = lambda _: None,
) -> Checkpoint:
    """Open ``ref`` by its config, index and shard headers; failures are one-line
    :class:`InputError`s naming the repository."""
    with _hub_errors(ref):
        if _offline():
            return _open_cached(ref)
        traffic = Traffic()
        client = _Client(ref, _endpoint(), traffic)
        checkpoint = _open_online(ref, client, fetch_bytes)
        shards = len(files_of(checkpoint.tensors))
        then = "; tensor bytes by range as checks need them" if fetch_bytes else ", no tensor bytes"
        log(
            f"{ref}: fetched {human_size(traffic.bytes)} in {traffic.requests} requests "
            f"(repository information, config.json, index, {shards} shard headers){then}"
        )
        return checkpoint


def _open_cached(ref: HubRef) -> Checkpoint:
    """``HF_HUB_OFFLINE=1``: what the cache holds of ``ref``, opened as a local checkpoint."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    for name in (INDEX_FILE, SINGLE_FILE, "config.json"):
        try:
            local = hf_hub_download(ref.repo, name, revision=ref.revision, local_files_only=True)
        except LocalEntryNotFoundError:  # not cached: try the next file
            continue
        return HfSafetensorsReader().open(Path(local).parent)  # a cached snapshot is HF
    raise InputError(str(ref), "HF_HUB_OFFLINE is set and the repository is not in the cache")


def _open_online(ref: HubRef, client: _Client, fetch_bytes: bool) -> HubCheckpoint:
    commit, files = client.files()
    client.pin(commit)  # every later request reads this one snapshot
    shards = sorted(n for n in files if n.endswith(".safetensors"))
    if not shards:
        raise InputError(
            str(ref), f"no safetensors weights in the repository ({len(files)} files at {commit})"
        )
    # The headers of every shard the repository holds are read while config.json and the
    # index download: the latency of the small files hides behind the shards'. Only the
    # headers of the shards the index names (all, without one) are then waited for.
    with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
        small = {
            name: pool.submit(client.download, name)
            for name in ("config.json", INDEX_FILE)
            if name in files
        }
        pending = {shard: pool.submit(_header, client, shard) for shard in shards}
        local = {name: job.result() for name, job in small.items()}
        weight_map: dict[str, str] | None = None  # no index: every shard is read
        if INDEX_FILE in local:
            weight_map = read_index(local[INDEX_FILE])
            _check_shard_names(ref, weight_map)
        wanted = shards if weight_map is None else sorted(set(weight_map.values()))
        headers = {shard: pending[shard].result() for shard in wanted if shard in pending}
    config: dict[str, Any] = {}
    config_path: str | None = None
    if "config.json" in local:
        config, config_path = read_config(local["config.json"]), f"{ref}/config.json"
    tensors, issues = shard_tensors(weight_map, headers, shards, _IN_THE_REPOSITORY)
    return HubCheckpoint(
        path=str(ref),
        config=config,
        config_path=config_path,
        tensors=tensors,
        issues=tuple(issues),
        cross_checked=cross_checked(weight_map is not None, len(headers)),
        ref=ref,
        commit=commit,
        files=files,
        client=client,
        fetch_bytes=fetch_bytes,
        written_as=written_as(headers.values()),
    )


def _check_shard_names(ref: HubRef, weight_map: Mapping[str, str]) -> None:
    for shard in set(weight_map.values()):
        if "/" in shard:  # read_index has refused backslashes and ".."
            raise InputError(f"{ref}/{INDEX_FILE}", f"shard {shown(shard, 200)} is in a sub-folder")


def _header(client: _Client, shard: str) -> ShardHeader:
    """One shard's header, and not a byte more: its 8-byte length, then the header."""
    where = f"{client.ref}/{shard}"
    prefix, total = client.range_with_total(shard, 0, 8)
    if len(prefix) < 8:
        raise HeaderError(where, f"file is {total} bytes, shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", prefix)
    if length > min(MAX_HEADER_BYTES, total - 8) or length == 0:
        raise HeaderError(where, f"header length {length} does not fit the file ({total} bytes)")
    return parse_header_bytes(shard, prefix, client.range(shard, 8, length), total)


class _hub_errors:  # noqa: N801  (used as a context manager)
    """huggingface_hub and network exceptions as one-line input errors."""

    def __init__(self, ref: HubRef) -> None:
        self.ref = ref

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: Any
    ) -> Literal[False]:
        """Pass ``e`` on, or raise it again as an :class:`InputError` (never swallowed)."""
        if e is None or isinstance(e, InputError | KeyboardInterrupt):
            return False
        reason = _explain(self.ref, e)
        if reason is None:
            return False
        if self.ref.bare:
            reason += f" (read as a Hub repository: no local path {self.ref.repo} exists)"
        raise InputError(str(self.ref), reason) from e


def _explain(ref: HubRef, e: BaseException) -> str | None:
    from huggingface_hub import errors

    if isinstance(e, errors.GatedRepoError):
        return (
            "gated repository: request access on its Hub page, then log in "
            "(`hf auth login`) or set HF_TOKEN"
        )
    if isinstance(e, errors.RepositoryNotFoundError):
        return (
            "repository not found, or private: check the name, and log in "
            "(`hf auth login`) or set HF_TOKEN if it is private"
        )
    if isinstance(e, errors.RevisionNotFoundError):
        return f"revision {shown(ref.revision, 200)} does not exist"
    if isinstance(e, errors.LocalEntryNotFoundError):
        return f"cannot reach {_endpoint()} and the file is not cached"
    if isinstance(e, errors.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        extra = " (rate limited)" if status == 429 else ""
        return f"HTTP {status}{extra} from {_endpoint()} after {RETRIES} retries"
    name = type(e).__name__
    if isinstance(e, OSError) or "Timeout" in name or "Network" in name or "Connect" in name:
        return f"cannot reach {_endpoint()}: {name}: {e}"
    return None
