"""Python models' own metrics (Triton's custom metrics, ``pb_utils.MetricFamily``) on the
worker's /metrics.

Each model process sends its families with its answers (``workers/backends/pb_metrics.py``);
its ``PythonBackend`` keeps the latest (a process that sends only what changed has it folded
into what is kept: ``fold``). At a scrape, this collector merges the families of every model
process the worker process runs, by name: the instances of one model (each a process of its
own) add up, counters and histograms summed per label set. A gauge is not shared as a Triton
server's instances share one: each instance process keeps its own value, and a gauge shows
the value of the instance that set or incremented it most recently (its ``stamp``, the
host's monotonic clock); an increment makes that instance's value the one served (A +3,
then B +1, shows 1; Triton's shared gauge shows 4). A family that two models define with
different kinds, or a histogram whose buckets differ, keeps the first one seen and logs the
clash. Names and labels are the model's own; Triton adds none.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client.metrics_core import Metric

from plaza.workers.backends.pb_metrics import Snapshot

log = logging.getLogger(__name__)
Labels = tuple[tuple[str, str], ...]


class Source(Protocol):
    """What holds a model process's latest snapshot (a ``PythonBackend``)."""

    custom_metrics: Snapshot


@dataclass(slots=True)
class _Family:
    description: str
    kind: str
    values: dict[Labels, float] = field(default_factory=dict)
    stamps: dict[Labels, int] = field(default_factory=dict)
    """A gauge's label sets: when the value served was set (``pb_metrics`` ``stamp``)."""
    histograms: dict[Labels, tuple[list[float], list[int], float]] = field(default_factory=dict)


class CustomMetrics:
    """The collector: the model processes' families, merged, at every scrape."""

    def __init__(self) -> None:
        self._sources: list[Source] = []
        self._lock = threading.Lock()
        self._clashes: set[str] = set()

    def add(self, source: Source) -> None:
        with self._lock:
            self._sources.append(source)

    def remove(self, source: Source) -> None:
        with self._lock:
            if source in self._sources:
                self._sources.remove(source)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshots = [source.custom_metrics for source in self._sources]
        merged: dict[str, _Family] = {}
        for snapshot in snapshots:
            for family in snapshot:
                self._merge(merged, family)
        for name, kept in merged.items():
            yield _exposed(name, kept)

    def _merge(self, merged: dict[str, _Family], family: Mapping[str, Any]) -> None:
        name, kind = str(family["name"]), str(family["kind"])
        known = merged.setdefault(name, _Family(str(family["description"]), kind))
        if known.kind != kind:
            self._clash(name, f"defined as a {known.kind} and as a {kind}")
            return
        for metric in family["metrics"]:
            labels = _key(metric)
            if kind == "gauge":
                stamp = int(metric.get("stamp", 0))
                if labels not in known.values or stamp > known.stamps[labels]:
                    known.values[labels], known.stamps[labels] = float(metric["value"]), stamp
            elif kind == "counter":
                known.values[labels] = known.values.get(labels, 0.0) + float(metric["value"])
            else:
                self._add_histogram(name, known, labels, metric)

    def _add_histogram(
        self, name: str, known: _Family, labels: Labels, metric: Mapping[str, Any]
    ) -> None:
        bounds, counts = list(metric["buckets"]), list(metric["counts"])
        total = float(metric["sum"])
        seen = known.histograms.get(labels)
        if seen is None:
            known.histograms[labels] = (bounds, counts, total)
        elif seen[0] != bounds:
            self._clash(name, "histograms of one label set with different buckets")
        else:
            summed = [a + b for a, b in zip(seen[1], counts, strict=True)]
            known.histograms[labels] = (bounds, summed, seen[2] + total)

    def _clash(self, name: str, why: str) -> None:
        if name not in self._clashes:
            self._clashes.add(name)
            log.warning("custom metric %r: %s; the first one seen is served", name, why)


def fold(kept: Snapshot, changes: Snapshot) -> Snapshot:
    """What a model process holds after ``changes`` (``pb_metrics`` ``changes``) on top of
    ``kept``: each changed metric replaces the one of its family and labels. A new list
    (a scrape may be reading ``kept``); the families that did not change are shared."""
    by_name = {str(family["name"]): family for family in kept}
    for family in changes:
        name = str(family["name"])
        known = by_name.get(name)
        if known is None or (known["kind"], known["description"]) != (
            family["kind"],
            family["description"],
        ):
            by_name[name] = family
            continue
        metrics = {_key(m): m for m in known["metrics"]}
        metrics.update((_key(m), m) for m in family["metrics"])
        by_name[name] = {**known, "metrics": list(metrics.values())}
    return list(by_name.values())


def _key(metric: Mapping[str, Any]) -> Labels:
    return tuple(sorted(dict(metric["labels"]).items()))


def _exposed(name: str, family: _Family) -> Metric:
    metric = Metric(name, family.description, family.kind)
    for labels, value in family.values.items():
        metric.add_sample(name, dict(labels), value)
    for labels, (bounds, counts, total) in family.histograms.items():
        running = 0
        for bound, count in zip([*bounds, float("inf")], counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else repr(bound)
            metric.add_sample(f"{name}_bucket", {**dict(labels), "le": le}, running)
        metric.add_sample(f"{name}_sum", dict(labels), total)
        metric.add_sample(f"{name}_count", dict(labels), running)
    return metric
