"""Custom metrics of a Python model (Triton's ``pb_utils.MetricFamily``), in its process.

A ``model.py`` makes families (counter, gauge, histogram) and metrics of them by labels, and
updates them; this module keeps their values in the model's process. After each
``initialize`` and ``execute`` the process sends what changed since the last time as a
snapshot (``snapshot``): every family with all its metrics, plain data for the channel. The
worker keeps the latest snapshot of each model process and serves it on its /metrics
(``workers/custom_metrics.py``). An update made outside those calls (a thread of the model)
shows after the next one. Names are Prometheus names; ``nv_`` and ``plaza_`` are Triton's
and Plaza's own, and refused.
"""

from __future__ import annotations

import bisect
import itertools
import re
import threading
from typing import Any, ClassVar

from plaza.workers.backends.pb_exception import TritonModelException

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED = ("nv_", "plaza_")
_KINDS = ("counter", "gauge", "histogram")

Snapshot = list[dict[str, Any]]
"""Families as plain data: name, description, kind, metrics (labels and values)."""


class MetricsError(TritonModelException):
    """A metric used against its kind or its name's rules (model code catches it as
    Triton's exception)."""


class _Registry:
    """The families of one model process; ``changed`` since the last snapshot."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, MetricFamily] = {}
        self.changed = False

    def snapshot(self) -> Snapshot | None:
        """Every family, if anything changed since the last call; else None."""
        with self.lock:
            if not self.changed:
                return None
            self.changed = False
            return [family._snapshot() for family in self.families.values()]


registry = _Registry()


class MetricFamily:
    """A named family of metrics of one kind (``COUNTER``, ``GAUGE``, ``HISTOGRAM``)."""

    COUNTER: ClassVar[int] = 0
    GAUGE: ClassVar[int] = 1
    HISTOGRAM: ClassVar[int] = 2

    def __init__(self, name: str, description: str, kind: int) -> None:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise MetricsError(f"metric family name {name!r} is not a Prometheus name")
        if name.startswith(_RESERVED):
            raise MetricsError(f"metric family name {name!r}: nv_ and plaza_ names are reserved")
        if kind not in (self.COUNTER, self.GAUGE, self.HISTOGRAM):
            raise MetricsError(f"metric family {name!r}: kind must be COUNTER, GAUGE or HISTOGRAM")
        self.name, self.description, self.kind = name, str(description), _KINDS[kind]
        self._metrics: dict[tuple[tuple[str, str], ...], CustomMetric] = {}
        with registry.lock:
            known = registry.families.get(name)
            if known is not None and (known.kind, known.description) != (
                self.kind,
                self.description,
            ):
                raise MetricsError(
                    f"metric family {name!r} exists already with another kind or description"
                )
            if known is not None:
                self._metrics = known._metrics  # the same family, made again: one set of values
            registry.families[name] = self
            registry.changed = True

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> CustomMetric:
        """The family's metric of ``labels`` (made on first use); a histogram's needs its
        ``buckets`` (upper bounds, increasing)."""
        labels = dict(labels or {})
        for label, value in labels.items():
            if not isinstance(label, str) or not _LABEL.fullmatch(label) or label == "le":
                raise MetricsError(f"metric {self.name!r}: label name {label!r} is not allowed")
            if not isinstance(value, str):
                raise MetricsError(f"metric {self.name!r}: label {label!r} must be a string")
        key = tuple(sorted(labels.items()))
        with registry.lock:
            metric = self._metrics.get(key)
            if metric is None:
                metric = self._metrics[key] = CustomMetric(self, labels, buckets)
                registry.changed = True
        return metric

    def _snapshot(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "kind": self.kind,
            "metrics": [m._snapshot() for m in self._metrics.values()],
        }


class CustomMetric:
    """One metric of a family: ``increment`` (counter, gauge), ``set`` (gauge), ``value``
    (counter, gauge), ``observe`` (histogram)."""

    def __init__(
        self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None
    ) -> None:
        self._family = family
        self._labels = labels
        self._value = 0.0
        self._bounds: list[float] = []
        if family.kind == "histogram":
            if not buckets or any(b >= c for b, c in itertools.pairwise(buckets)):
                raise MetricsError(
                    f"histogram {family.name!r} needs buckets: upper bounds, increasing"
                )
            self._bounds = [float(b) for b in buckets]
        elif buckets is not None:
            raise MetricsError(f"metric {family.name!r}: only a histogram takes buckets")
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound
        self._sum = 0.0

    def _only(self, *kinds: str, what: str) -> None:
        if self._family.kind not in kinds:
            raise MetricsError(f"{what} is not for a {self._family.kind} ({self._family.name!r})")

    def increment(self, value: float) -> None:
        self._only("counter", "gauge", what="increment")
        if self._family.kind == "counter" and value < 0:
            raise MetricsError(f"counter {self._family.name!r} cannot go down ({value})")
        with registry.lock:
            self._value += float(value)
            registry.changed = True

    def set(self, value: float) -> None:
        self._only("gauge", what="set")
        with registry.lock:
            self._value = float(value)
            registry.changed = True

    def value(self) -> float:
        self._only("counter", "gauge", what="value")
        return self._value

    def observe(self, value: float) -> None:
        self._only("histogram", what="observe")
        with registry.lock:
            self._counts[bisect.bisect_left(self._bounds, float(value))] += 1
            self._sum += float(value)
            registry.changed = True

    def _snapshot(self) -> dict[str, Any]:
        if self._family.kind != "histogram":
            return {"labels": self._labels, "value": self._value}
        return {
            "labels": self._labels,
            "buckets": self._bounds,
            "counts": list(self._counts),
            "sum": self._sum,
        }
