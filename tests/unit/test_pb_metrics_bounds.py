"""Bounds of a Python model's custom metrics (``workers/backends/pb_metrics.py``): label
names, finite values and bucket bounds, caps on families and label sets, replies that carry
only what changed (``changes``, folded by the worker: ``custom_metrics.fold``), and the
newest gauge value of several instances (``custom_metrics.CustomMetrics``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from plaza.metrics import render
from plaza.workers.backends import pb_metrics, pb_utils
from plaza.workers.backends.pb_metrics import MetricFamily, MetricsError, Snapshot
from plaza.workers.custom_metrics import CustomMetrics, fold
from tests.metrics_support import samples, value

NAN, INF = math.nan, math.inf


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A model process's registry of its own for each test."""
    monkeypatch.setattr(pb_metrics, "registry", pb_metrics._Registry())
    yield


def counter(name: str = "c") -> pb_utils.Metric:
    return MetricFamily(name, "d", MetricFamily.COUNTER).Metric()


def gauge(name: str = "g") -> pb_utils.Metric:
    return MetricFamily(name, "d", MetricFamily.GAUGE).Metric()


def histogram(buckets: list[float]) -> pb_utils.Metric:
    return MetricFamily("h", "d", MetricFamily.HISTOGRAM).Metric(buckets=buckets)


@pytest.mark.parametrize("label", ["__name__", "__meta", "le"])
def test_reserved_label_names_are_refused(label: str) -> None:
    family = MetricFamily("jobs", "d", MetricFamily.COUNTER)
    with pytest.raises(MetricsError, match="is not allowed"):
        family.Metric(labels={label: "x"})
    assert family.Metric(labels={"_one": "x"}).value() == 0  # one underscore is fine


@pytest.mark.parametrize(
    ("use", "words"),
    [
        (lambda: histogram([1.0, INF]), "finite"),
        (lambda: histogram([NAN]), "finite"),
        (lambda: histogram([-INF, 0.0]), "finite"),
        (lambda: histogram([1.0, 1.0]), "increasing"),
        (lambda: histogram(["a"]), "not a number"),  # type: ignore[list-item]
        (lambda: counter().increment(NAN), "finite"),
        (lambda: counter().increment(INF), "finite"),
        (lambda: gauge().increment(-INF), "finite"),
        (lambda: gauge().set(NAN), "finite"),
        (lambda: gauge().set("x"), "not a number"),  # type: ignore[arg-type]
        (lambda: histogram([1.0]).observe(NAN), "finite"),
    ],
)
def test_non_finite_numbers_are_refused(use: Callable[[], Any], words: str) -> None:
    with pytest.raises(MetricsError, match=words):
        use()


def test_a_refused_value_leaves_the_metric_as_it_was() -> None:
    c, g = counter(), gauge()
    c.increment(2)
    g.set(1e308)
    with pytest.raises(MetricsError):
        c.increment(NAN)
    with pytest.raises(MetricsError):
        g.increment(1e308)  # its sum would be inf
    assert (c.value(), g.value()) == (2, 1e308)
    snapshot = pb_metrics.registry.snapshot()
    assert snapshot is not None
    assert all(math.isfinite(m["value"]) for f in snapshot for m in f["metrics"])


def test_families_and_label_sets_are_capped() -> None:
    assert (pb_metrics.MAX_FAMILIES, pb_metrics.MAX_METRICS_PER_FAMILY) == (64, 1000)
    for i in range(pb_metrics.MAX_FAMILIES):
        MetricFamily(f"f{i}", "d", MetricFamily.COUNTER)
    with pytest.raises(MetricsError, match="64 families at most"):
        MetricFamily("one_more", "d", MetricFamily.COUNTER)
    family = MetricFamily("f0", "d", MetricFamily.COUNTER)  # made again: no new family
    for i in range(pb_metrics.MAX_METRICS_PER_FAMILY):
        family.Metric(labels={"n": str(i)})
    with pytest.raises(MetricsError, match="1000 label sets at most"):
        family.Metric(labels={"n": "new"})
    family.Metric(labels={"n": "7"}).increment(1)  # a known label set still is
    assert len(pb_metrics.registry.families) == 64


def test_a_reply_carries_only_what_changed_and_the_worker_folds_it() -> None:
    family = MetricFamily("per_id", "d", MetricFamily.COUNTER)
    for i in range(100):
        family.Metric(labels={"id": str(i)}).increment(1)
    level = gauge("level")
    kept = fold([], pb_metrics.registry.changes() or [])
    family.Metric(labels={"id": "5"}).increment(2)
    level.set(4)
    changes = pb_metrics.registry.changes()
    assert changes is not None
    assert sorted(len(f["metrics"]) for f in changes) == [1, 1]  # not the other 99
    assert pb_metrics.registry.changes() is None  # nothing since
    kept = fold(kept, changes)
    family.Metric(labels={"id": "5"}).increment(0)  # a change: snapshot() gives everything
    whole = {f["name"]: f for f in pb_metrics.registry.snapshot() or []}
    assert {f["name"]: f for f in kept} == whole
    assert {m["labels"]["id"]: m["value"] for m in whole["per_id"]["metrics"]}["5"] == 3


class _Process:
    def __init__(self, snapshot: Snapshot) -> None:
        self.custom_metrics = snapshot


def _gauge(value: float, stamp: int) -> Snapshot:
    return [
        {
            "name": "busy",
            "description": "d",
            "kind": "gauge",
            "metrics": [{"labels": {}, "value": value, "stamp": stamp}],
        }
    ]


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_a_gauge_of_several_instances_is_the_value_set_last(order: tuple[int, int]) -> None:
    instances = [_Process(_gauge(0.0, 0)), _Process(_gauge(0.0, 0))]
    custom = CustomMetrics()
    for i in order:
        custom.add(instances[i])
    instances[0].custom_metrics = _gauge(3.0, 20)  # instance 0 set it last
    instances[1].custom_metrics = _gauge(1.0, 10)
    assert value(samples(render(custom).decode()), "busy") == 3.0


def test_two_model_processes_gauges_merge_by_when_they_were_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each registry a process of its own: the one that set the gauge later wins."""
    processes = []
    for n in (5.0, 2.0):
        monkeypatch.setattr(pb_metrics, "registry", pb_metrics._Registry())
        gauge("busy").set(n)
        processes.append(_Process(pb_metrics.registry.snapshot() or []))
    custom = CustomMetrics()
    for process in reversed(processes):
        custom.add(process)
    assert value(samples(render(custom).decode()), "busy") == 2.0
