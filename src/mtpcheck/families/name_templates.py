"""Name templates (``model.layers.{n}.enorm.weight``) matched against a checkpoint's tensor
names, kept sorted: by prefix runs and bisection, or by a C-speed search of the names joined
one per line, rather than one regex match per tensor (DeepSeek-V3 has 92k)."""

from __future__ import annotations

import bisect
import functools
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter

PLACEHOLDERS = ("i", "n", "first", "last", "d", "t", "k")
"""Placeholders a family's name template may hold, each standing for a layer number: ``{i}``
the MTP depth (in a flat family's layer prefix, the flat index), ``{n}`` the absolute layer
number, ``{first}`` / ``{last}`` a depth's first and last flat layer, ``{d}`` / ``{t}`` a
nested layer's depth and position within it, ``{k}`` a main decoder layer's number."""
EXPERT = "e"
"""The placeholder of a routed expert's index, ``{e}``: the HF <-> Megatron rules' and the
stacked experts' per-expert names (``mlp.experts.{e}.gate_proj.weight``)."""


@functools.lru_cache(maxsize=256)
def template_pattern(template: str, prefix_only: bool) -> re.Pattern[str]:
    """The regex of ``template``, each placeholder a run of digits captured under its name:
    matching a whole name, or with ``prefix_only`` its start."""
    body = re.escape(template)
    for name in (*PLACEHOLDERS, EXPERT):
        body = body.replace(r"\{" + name + r"\}", rf"(?P<{name}>\d+)")
    return re.compile("^" + body + ("" if prefix_only else "$"))


def depth_of(values: Mapping[str, str | int | None], base: int, span: int) -> int:
    """The MTP depth a matched name belongs to, from its placeholders' digits (the inverse of
    :meth:`NameTemplate.fill`): ``{n}`` less ``base``, ``{d}`` itself, a flat index (``{i}``,
    ``{first}``, ``{last}``) over ``span``; 0 for a name without any (one shared tensor).
    Negative for a main layer's number."""
    if values.get("n") is not None:
        return int(str(values["n"])) - base
    if values.get("d") is not None:
        return int(str(values["d"]))
    for key in ("i", "first", "last"):
        if values.get(key) is not None:
            return int(str(values[key])) // span
    return 0


@dataclass(frozen=True)
class NameTemplate:
    """A tensor name with layer-number placeholders (``model.layers.{n}.enorm.weight``,
    ``model.layers.{k}.``; see :data:`PLACEHOLDERS`): the one place that fills them with an MTP
    depth, a main layer's number or an expert's index and reads them back from a checkpoint's
    names."""

    text: str

    @property
    def fixed(self) -> bool:
        """Whether the template has no placeholder: one name, shared by every depth."""
        return "{" not in self.text

    def fill(self, i: int, base: int = 0, span: int = 1) -> str:
        """The name for MTP depth ``i`` of a checkpoint with ``base`` main layers: ``{i}`` the
        depth (in a flat family's layer prefix, the flat index), ``{n}`` the absolute layer
        number ``base + i``, ``{first}`` / ``{last}`` the first and last flat layer of a depth
        spanning ``span`` flat layers; ``{d}`` the depth and ``{t}`` the position within it,
        where a depth's flat layers nest under it (Megatron's hybrid MTP: with ``{t}``, ``i``
        is the flat index)."""
        text = self.text
        if "{t}" in text:  # a nested layer prefix: ``i`` is the flat index
            text = text.replace("{d}", str(i // span)).replace("{t}", str(i % span))
        return (
            text.replace("{first}", str(i * span))
            .replace("{last}", str(i * span + span - 1))
            .replace("{i}", str(i))
            .replace("{d}", str(i))
            .replace("{n}", str(base + i))
        )

    def main_layer(self, k: int | str) -> str:
        """The name in main decoder layer ``k`` (``{k}`` filled, with the number or its digits
        as a name spells them): the main layer a block mirrors, given its number."""
        return self.text.replace("{k}", str(k))

    def expert(self, e: int | str) -> str:
        """The name of routed expert ``e`` (``{e}`` filled, with the number or its digits)."""
        return self.text.replace("{e}", str(e))

    def holds(self, placeholder: str) -> bool:
        """Whether the template holds ``{placeholder}`` (``"e"``: one name per expert)."""
        return "{" + placeholder + "}" in self.text

    def around(self, placeholder: str) -> tuple[str, str]:
        """The text before and after ``{placeholder}`` (the whole text and "" without it): a
        main layer prefix's ``model.layers.`` and ``.`` around ``{k}``, to read a number off
        a filled name."""
        head, _, tail = self.text.partition("{" + placeholder + "}")
        return head, tail

    def renamed(self, old: str, new: str) -> NameTemplate:
        """The template with ``{old}`` spelled ``{new}`` (a flat depth ``{i}`` as a nested
        layer's depth ``{d}``)."""
        return NameTemplate(self.text.replace("{" + old + "}", "{" + new + "}"))

    def match(self, name: str) -> dict[str, int] | None:
        """The placeholders' numbers if ``name`` is this template filled; else None."""
        m = template_pattern(self.text, prefix_only=False).match(name)
        return None if m is None else {k: int(v) for k, v in m.groupdict().items()}

    def match_prefix(self, name: str) -> tuple[dict[str, int], int] | None:
        """The placeholders' numbers and the prefix's length if ``name`` starts with this
        template filled (a layer prefix); else None."""
        m = template_pattern(self.text, prefix_only=True).match(name)
        return None if m is None else ({k: int(v) for k, v in m.groupdict().items()}, m.end())


def matches_template(template: str, name: str) -> bool:
    """Whether ``name`` is ``template`` with its placeholders filled by layer numbers."""
    return NameTemplate(template).match(name) is not None


def fill_template(template: str, i: int, base: int, span: int = 1) -> str:
    """``template`` filled for MTP depth ``i`` (:meth:`NameTemplate.fill`)."""
    return NameTemplate(template).fill(i, base, span)


def _past(prefix: str) -> str:
    """The least string above every string that starts with ``prefix`` (non-empty)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _run_end(names: list[str], prefix: str, lo: int, hi: int) -> int:
    """End of the run of ``names[lo:hi]`` (sorted) that starts with ``prefix``."""
    if prefix and ord(prefix[-1]) < sys.maxunicode:
        return bisect.bisect_left(names, _past(prefix), lo, hi)
    while lo < hi and names[lo].startswith(prefix):
        lo += 1
    return lo


def prefix_runs(names: list[str], template: str) -> list[tuple[int, int, int, dict[str, str]]]:
    """Where the prefix template matches the sorted ``names``: ``(start, stop, end, groups)``.

    Names sharing one matched prefix (``model.layers.7.``) are consecutive in sorted order and
    match alike (the pattern looks at no character past its match), so each run is matched
    once and skipped by bisection: a handful of regex matches instead of one per tensor.
    ``end`` is the prefix length, ``groups`` the placeholders' digits.
    """
    pattern = template_pattern(template, prefix_only=True)
    literal = template.split("{", 1)[0]
    # Runs are sound when each placeholder is followed by a literal non-digit, so that the
    # digits' end is inside the match; otherwise every name is matched on its own.
    runs_sound = all(
        t[:1] and not t[0].isdecimal() and t[0] != "{" for t in template.split("}")[1:]
    )
    i = bisect.bisect_left(names, literal)
    stop_all = _run_end(names, literal, i, len(names))
    runs = []
    while i < stop_all:
        m = pattern.match(names[i])
        if m is None:
            i += 1
            continue
        j = _run_end(names, names[i][: m.end()], i + 1, stop_all) if runs_sound else i + 1
        runs.append((i, j, m.end(), m.groupdict()))
        i = j
    return runs


def full_matches(
    names: list[str], joined: str | None, template: str
) -> Iterator[tuple[str, re.Match[str]]]:
    """Names matching the whole template. The template's literal tail is searched for in
    ``joined`` (the names, each followed by a newline) at C speed; only names ending with it
    are matched against the regex."""
    pattern = template_pattern(template, prefix_only=False)
    tail = template.rsplit("}", 1)[-1]
    if joined is None or not tail or "\n" in tail:
        for name in names:
            if name.endswith(tail) and (m := pattern.match(name)):
                yield name, m
        return
    needle = tail + "\n"
    at = joined.find(needle)
    while at >= 0:
        end = at + len(tail)
        name = joined[joined.rfind("\n", 0, at) + 1 : end]
        if m := pattern.match(name):
            yield name, m
        at = joined.find(needle, end + 1)


def joined_names(names: list[str]) -> str | None:
    """The names, one per line, for :func:`full_matches`; None if a name holds a newline."""
    joined = "\n".join(names) + "\n"
    return joined if joined.count("\n") == len(names) else None


class LayerNames(Mapping[int, frozenset[str]]):
    """Main layer number -> the names of its tensors relative to its prefix (``mlp.gate.weight``),
    for layers below ``base``; ``template`` is the main layers' prefix (``model.layers.{k}.``).
    A layer's set is built when it is first looked up: the search for the layer
    an MTP block mirrors looks at the latest layers first and usually stops at one."""

    def __init__(self, names: list[str], template: str, base: int | None) -> None:
        self._names = names
        self._runs: dict[int, list[tuple[int, int, int]]] = {}
        for start, stop, end, groups in prefix_runs(names, template):
            k = int(groups["k"])
            if base is None or k < base:
                self._runs.setdefault(k, []).append((start, stop, end))
        self._built: dict[int, frozenset[str]] = {}

    def __getitem__(self, k: int) -> frozenset[str]:
        found = self._built.get(k)
        if found is None:
            runs = self._runs[k]  # KeyError: no such layer
            found = self._built[k] = frozenset(
                name
                for start, stop, end in runs
                for name in map(itemgetter(slice(end, None)), self._names[start:stop])
            )
        return found

    def __iter__(self) -> Iterator[int]:
        return iter(self._runs)

    def __len__(self) -> int:
        return len(self._runs)
