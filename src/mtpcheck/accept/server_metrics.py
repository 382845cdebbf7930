"""A server's ``/metrics`` page, read with ``prometheus_client``'s own parser of the text
exposition format, and the difference of two readings.

Counters are kept by sample name as it appears on the wire (``vllm:spec_decode_num_drafts_total``
with its ``_total``), summed over the label sets mtpcheck does not ask about (an engine
index, a model name), so that a server of several engines reads as one.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from mtpcheck.accept.server_http import Server, ServerError
from mtpcheck.errors import raised_by_us, shown_text


@dataclass(frozen=True)
class Reading:
    """One scrape: every sample's value per label set."""

    samples: Mapping[str, tuple[tuple[Mapping[str, str], float], ...]] = field(default_factory=dict)

    @staticmethod
    def parse(text: str, where: str) -> Reading:
        """The samples of Prometheus exposition ``text`` (``where``: the page, for errors)."""
        from prometheus_client.parser import text_string_to_metric_families

        samples: dict[str, list[tuple[Mapping[str, str], float]]] = defaultdict(list)
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    value = float(sample.value)
                    if not math.isfinite(value):
                        raise ServerError(where, f"{sample.name} is {value:g}, not a count")
                    samples[sample.name].append((dict(sample.labels), value))
        except ServerError:
            raise
        except Exception as e:  # the parser raises ValueError, and more on odd text
            if raised_by_us(e):
                raise
            said = shown_text(str(e).split("\n", 1)[0], 200)
            raise ServerError(where, f"not Prometheus exposition text ({said})") from e
        return Reading({name: tuple(values) for name, values in samples.items()})

    def names(self) -> frozenset[str]:
        """Every sample name of the scrape."""
        return frozenset(self.samples)

    def has(self, name: str) -> bool:
        """Whether the scrape holds the sample ``name``."""
        return name in self.samples

    def total(self, name: str) -> float:
        """The sample summed over its label sets (0 where the server does not export it)."""
        return sum(value for _, value in self.samples.get(name, ()))

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """The sample summed per value of one label (e.g. vLLM's draft ``position``)."""
        sums: dict[str, float] = defaultdict(float)
        for labels, value in self.samples.get(name, ()):
            if label in labels:
                sums[labels[label]] += value
        return dict(sums)


def scrape(server: Server, page: str = "/metrics") -> Reading:
    """``GET page`` and parse it; a server without the page is told how to turn it on."""
    try:
        text = server.get_text(page)
    except ServerError as e:
        raise ServerError(
            server.url(page),
            f"{e.reason}; mtpcheck reads the engine's counters there (llama-server needs "
            "--metrics, SGLang --enable-metrics)",
        ) from e
    return Reading.parse(text, server.url(page))


def moved(before: Reading, after: Reading, name: str, where: str) -> float:
    """How far a counter moved between two readings; a counter that went down means the
    server restarted (its counters reset) in between, and nothing measured across it holds."""
    change = after.total(name) - before.total(name)
    if change < 0:
        raise ServerError(
            where,
            f"{name} went down from {before.total(name):g} to {after.total(name):g} during the "
            "run: the server restarted (its counters reset); run again",
        )
    return change


def moved_by_label(
    before: Reading, after: Reading, name: str, label: str, where: str
) -> dict[str, float]:
    """:func:`moved` per value of ``label``."""
    first, last = before.by_label(name, label), after.by_label(name, label)
    change = {}
    for key in sorted(set(first) | set(last)):
        change[key] = last.get(key, 0.0) - first.get(key, 0.0)
        if change[key] < 0:
            raise ServerError(
                where,
                f"{name}{{{label}={key!r}}} went down during the run: the server restarted "
                "(its counters reset); run again",
            )
    return change
