"""Custom metrics of Python models: the families a model.py keeps
(``workers/backends/pb_metrics.py``, ``pb_utils.MetricFamily``) and the worker's collector
that merges the model processes' snapshots (``workers/custom_metrics.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from plaza.metrics import render
from plaza.workers.backends import pb_metrics, pb_utils
from plaza.workers.backends.pb_metrics import MetricFamily, Snapshot
from plaza.workers.custom_metrics import CustomMetrics
from tests.metrics_support import samples, value


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A model process's registry of its own for each test."""
    monkeypatch.setattr(pb_metrics, "registry", pb_metrics._Registry())
    yield


def test_a_model_counts_sets_and_observes() -> None:
    assert pb_utils.MetricFamily is MetricFamily  # what model.py reaches through pb_utils
    requests = MetricFamily("requests", "requests seen", MetricFamily.COUNTER)
    queue = MetricFamily("queue_depth", "items queued", MetricFamily.GAUGE)
    sizes = MetricFamily("input_size", "input elements", MetricFamily.HISTOGRAM)
    ok = requests.Metric(labels={"outcome": "ok"})
    ok.increment(2)
    ok.increment(1.5)
    requests.Metric(labels={"outcome": "ok"}).increment(1)  # the same metric again
    depth = queue.Metric()
    depth.set(7)
    depth.increment(-2)
    observed = sizes.Metric(buckets=[1, 10, 100])
    for v in (0.5, 3, 10, 500):
        observed.observe(v)
    assert ok.value() == 4.5 and depth.value() == 5
    snapshot = pb_metrics.registry.snapshot()
    assert snapshot is not None
    by_name = {f["name"]: f for f in snapshot}
    assert by_name["requests"]["metrics"] == [{"labels": {"outcome": "ok"}, "value": 4.5}]
    hist = by_name["input_size"]["metrics"][0]
    assert hist["counts"] == [1, 2, 0, 1] and hist["sum"] == 513.5  # 10 falls in le=10
    assert pb_metrics.registry.snapshot() is None  # nothing changed since


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: MetricFamily("nv_mine", "d", MetricFamily.COUNTER), "reserved"),
        (lambda: MetricFamily("bad name", "d", MetricFamily.COUNTER), "not a Prometheus name"),
        (lambda: MetricFamily("k", "d", 7), "kind must be"),
        (lambda: MetricFamily("c", "d", MetricFamily.COUNTER).Metric().increment(-1), "go down"),
        (lambda: MetricFamily("c", "d", MetricFamily.COUNTER).Metric().set(1), "set is not for"),
        (lambda: MetricFamily("h", "d", MetricFamily.HISTOGRAM).Metric(), "needs buckets"),
        (
            lambda: MetricFamily("h", "d", MetricFamily.HISTOGRAM).Metric(buckets=[2, 1]),
            "increasing",
        ),
        (
            lambda: MetricFamily("g", "d", MetricFamily.GAUGE).Metric(buckets=[1]),
            "only a histogram",
        ),
        (
            lambda: MetricFamily("g", "d", MetricFamily.GAUGE).Metric(labels={"le": "x"}),
            "not allowed",
        ),
    ],
)
def test_misuse_raises_tritons_exception(make: Any, words: str) -> None:
    with pytest.raises(pb_utils.TritonModelException, match=words):
        make()


def test_a_family_made_again_keeps_its_values_and_another_kind_is_refused() -> None:
    MetricFamily("n", "d", MetricFamily.COUNTER).Metric().increment(3)
    assert MetricFamily("n", "d", MetricFamily.COUNTER).Metric().value() == 3
    with pytest.raises(pb_utils.TritonModelException, match="exists already"):
        MetricFamily("n", "d", MetricFamily.GAUGE)


class _Process:
    def __init__(self, snapshot: Snapshot) -> None:
        self.custom_metrics = snapshot


def _family(name: str, kind: str, *metrics: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "description": f"{name} help", "kind": kind, "metrics": list(metrics)}


def test_the_worker_merges_its_model_processes(caplog: pytest.LogCaptureFixture) -> None:
    hist = {"labels": {}, "buckets": [1.0, 10.0], "counts": [1, 2, 3], "sum": 40.0}
    first = _Process(
        [
            _family("served", "counter", {"labels": {"m": "a"}, "value": 2.0}),
            _family("depth", "gauge", {"labels": {}, "value": 5.0}),
            _family("size", "histogram", hist),
        ]
    )
    second = _Process(
        [
            _family("served", "counter", {"labels": {"m": "a"}, "value": 3.0}),
            _family("size", "histogram", hist),
            _family("depth", "counter", {"labels": {}, "value": 1.0}),  # a clash
        ]
    )
    custom = CustomMetrics()
    custom.add(first)
    custom.add(second)
    got = samples(render(custom).decode())
    assert value(got, "served", m="a") == 5.0  # two instances of one model add up
    assert value(got, "depth") == 5.0  # the first kind seen is served
    assert value(got, "size_bucket", le="1.0") == 2
    assert value(got, "size_bucket", le="10.0") == 6
    assert value(got, "size_bucket", le="+Inf") == 12
    assert value(got, "size_sum") == 80.0 and value(got, "size_count") == 12
    assert "defined as a gauge and as a counter" in caplog.text
    custom.remove(second)
    assert value(samples(render(custom).decode()), "served", m="a") == 2.0
