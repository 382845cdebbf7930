"""A set of safetensors shards held to its index, wherever the shards are: the tensors loaders
see, and each way the index and the shards disagree as an :class:`IntegrityIssue`.

Both safetensors readers use it: the local one (a directory) and the Hub one (a repository),
each saying in its own words where a shard is or is not (:class:`ShardPlace`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from mtpcheck.formats.safetensors_header import ShardHeader
from mtpcheck.model import IntegrityIssue, TensorMeta, TensorTable
from mtpcheck.units import first_few


@dataclass(frozen=True)
class ShardPlace:
    """Where a reader finds shards, in the words of its issues."""

    absent: str
    """Ends ``index names shard X (N tensors) but ...``: ``the file is missing``."""
    present: str
    """What an unindexed shard does: ``sits beside the index``."""


def shard_tensors(
    weight_map: Mapping[str, str] | None,
    headers: Mapping[str, ShardHeader],
    present: Iterable[str],
    place: ShardPlace,
) -> tuple[Mapping[str, TensorMeta], list[IntegrityIssue]]:
    """The tensors loaders see in the shards whose ``headers`` were read (by shard name: those
    of ``present`` that the index's ``weight_map`` names, or all of them without an index:
    None), and every disagreement between index and shards, in that order: missing shards,
    truncated shards, index against headers, unindexed shards."""
    if weight_map is None:
        tensors, duplicates = _unindexed_tensors(headers.values())
        return tensors, [*_truncation_issues(headers.values()), *duplicates]
    named = set(weight_map.values())
    missing = sorted(named - headers.keys())
    held = Counter(weight_map.values()) if missing else Counter[str]()
    issues = [
        IntegrityIssue(
            "missing-shard",
            shard,
            f"index names shard {shard} ({held[shard]} tensors) but {place.absent}",
        )
        for shard in missing
    ]
    issues.extend(_truncation_issues(headers.values()))
    tensors = _indexed_tensors(weight_map, headers, issues)
    issues.extend(
        IntegrityIssue(
            "unindexed-shard", extra, f"{extra} {place.present} but the index does not mention it"
        )
        for extra in sorted(present)
        if extra not in named
    )
    return tensors, issues


def cross_checked(indexed: bool, files: int) -> str:
    """What opening a safetensors checkpoint checked, in words."""
    if indexed:
        return "headers and index"
    return "header" if files <= 1 else "headers (no index)"


def written_as(headers: Iterable[ShardHeader]) -> frozenset[str]:
    """The ``format`` values the shards' ``__metadata__`` record."""
    return frozenset(h.metadata["format"] for h in headers if "format" in h.metadata)


def _indexed_tensors(
    weight_map: Mapping[str, str],
    headers: Mapping[str, ShardHeader],
    issues: list[IntegrityIssue],
) -> Mapping[str, TensorMeta]:
    """The tensors loaders see through the index; disagreements with the headers are added to
    ``issues``."""
    tensors = _as_indexed(weight_map, headers)
    return tensors if tensors is not None else _reconcile(weight_map, headers, issues)


def _as_indexed(
    weight_map: Mapping[str, str], headers: Mapping[str, ShardHeader]
) -> TensorTable | None:
    """The usual case, checked in bulk: every shard is present and holds exactly the tensors
    the index gives it. Returns the tensors in name order, or None (then :func:`_reconcile`
    works out and words what disagrees)."""
    # Each header's names all map to that header's shard, and the counts agree: then no name
    # is in two shards, none is unindexed, and every indexed name is held (a bijection).
    if sum(len(h.columns.names) for h in headers.values()) != len(weight_map):
        return None
    for shard, header in headers.items():
        names = header.columns.names  # compared as lists: the loop runs in C
        if list(map(weight_map.get, names)) != [shard] * len(names):
            return None
    return TensorTable.of(h.columns for h in headers.values())


def _reconcile(
    weight_map: Mapping[str, str],
    headers: Mapping[str, ShardHeader],
    issues: list[IntegrityIssue],
) -> dict[str, TensorMeta]:
    """Index and shard headers disagree: the tensors loaders would see, each issue named."""
    tensors: dict[str, TensorMeta] = {}
    holders: dict[str, list[str]] = {}
    for shard, header in headers.items():
        for name in header.tensors:
            holders.setdefault(name, []).append(shard)
    for name, shard in sorted(weight_map.items()):
        if shard not in headers:
            continue
        where = holders.get(name, [])
        if shard in where:
            tensors[name] = headers[shard].tensors[name]
        elif where:
            issues.append(
                IntegrityIssue(
                    "index-wrong-shard",
                    name,
                    f"index places {name} in {shard}, but it is in {', '.join(where)}",
                )
            )
            tensors[name] = headers[where[0]].tensors[name]
        else:
            issues.append(
                IntegrityIssue(
                    "tensor-not-in-shard", name, f"index places {name} in {shard}, which lacks it"
                )
            )
    for name, where in sorted(holders.items()):
        if len(where) > 1:
            issues.append(
                IntegrityIssue(
                    "tensor-in-two-shards", name, f"{name} is stored in {' and '.join(where)}"
                )
            )
        if name not in weight_map:
            issues.append(
                IntegrityIssue(
                    "unindexed-tensor",
                    name,
                    f"{name} is in {where[0]} but not in the index (loaders will not see it)",
                )
            )
    return tensors


def _unindexed_tensors(
    headers: Iterable[ShardHeader],
) -> tuple[Mapping[str, TensorMeta], list[IntegrityIssue]]:
    """Shards without an index, merged; a name stored in two shards is an issue, and the
    first shard's copy is the one loaders see."""
    headers = list(headers)
    table = TensorTable.of(h.columns for h in headers)
    if table is not None:
        return table, []
    issues: list[IntegrityIssue] = []
    tensors: dict[str, TensorMeta] = {}
    for header in headers:
        for name, meta in header.tensors.items():
            if name in tensors:
                first = Path(tensors[name].file).name
                issues.append(
                    IntegrityIssue(
                        "tensor-in-two-shards",
                        name,
                        f"{name} is stored in {first} and {Path(header.path).name}",
                    )
                )
                continue
            tensors[name] = meta
    return tensors, issues


def _truncation_issues(headers: Iterable[ShardHeader]) -> list[IntegrityIssue]:
    """The shards whose data ends before their header says (truncated) or after it (trailing
    bytes)."""
    issues = []
    for header in headers:
        name = Path(header.path).name
        if header.truncated:
            cut = sorted(n for n, m in header.tensors.items() if not m.readable)
            issues.append(
                IntegrityIssue(
                    "truncated-shard",
                    name,
                    f"{name} is truncated: header declares {header.data_bytes_declared} data "
                    f"bytes, the file holds {header.data_bytes_on_disk} "
                    f"({len(cut)} tensors cut off: {first_few(cut, 4)})",
                )
            )
        elif header.data_bytes_on_disk > header.data_bytes_declared:
            extra = header.data_bytes_on_disk - header.data_bytes_declared
            issues.append(
                IntegrityIssue(
                    "trailing-bytes", name, f"{name} has {extra} bytes after the last tensor"
                )
            )
    return issues
