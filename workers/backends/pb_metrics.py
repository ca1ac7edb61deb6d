"""Custom metrics of a Python model (Triton's ``pb_utils.MetricFamily``), in its process.

A ``model.py`` makes families (counter, gauge, histogram) and metrics of them by labels, and
updates them; this module keeps their values in the model's process. After each
``initialize`` and ``execute`` the process sends its metrics, plain data for the channel:
``snapshot`` (every family with all its metrics, when anything changed) or ``changes``
(only the metrics that changed since the last call, for a worker that folds them into
what it holds: ``workers.custom_metrics.fold``). A gauge's value carries ``stamp``, when
it was last set or incremented (the host's monotonic clock, in ns; 0: never), so that the
worker serves the newest of its instances' values (each instance's own: a gauge is not
shared between instances as Triton's is). The worker serves them on its /metrics
(``workers/custom_metrics.py``). An update made outside those calls (a thread of the model)
shows after the next one. Names are Prometheus names; ``nv_`` and ``plaza_`` are Triton's
and Plaza's own, and refused, as are label names that start with ``__`` (Prometheus's) and
``le``. A process holds at most ``MAX_FAMILIES`` families and ``MAX_METRICS_PER_FAMILY``
label sets in each; values and bucket bounds are finite numbers.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from plaza.workers.backends.pb_exception import TritonModelException

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED = ("nv_", "plaza_")
_KINDS = ("counter", "gauge", "histogram")

MAX_FAMILIES = 64
"""Families one model process may make (a family made again counts once)."""
MAX_METRICS_PER_FAMILY = 1000
"""Label sets (metrics) one family may hold."""

Labels = tuple[tuple[str, str], ...]
Snapshot = list[dict[str, Any]]
"""Families as plain data: name, description, kind, metrics (labels and values)."""


class MetricsError(TritonModelException):
    """A metric used against its kind or its name's rules, or past a bound (model code
    catches it as Triton's exception)."""


class _Registry:
    """The families of one model process; what changed since the last snapshot."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.families: dict[str, MetricFamily] = {}
        self.touched: dict[str, dict[Labels, None]] = {}
        """Family name -> the label sets that changed, in order (none: the family is new)."""

    def touch(self, family: str, labels: Labels | None = None) -> None:
        """Note a change (the caller holds ``lock``)."""
        touched = self.touched.setdefault(family, {})
        if labels is not None:
            touched[labels] = None

    def snapshot(self) -> Snapshot | None:
        """Every family, if anything changed since the last call; else None."""
        with self.lock:
            if not self.touched:
                return None
            self.touched = {}
            return [family._snapshot() for family in self.families.values()]

    def changes(self) -> Snapshot | None:
        """The families that changed since the last call, each with only its metrics that
        changed; None when nothing did."""
        with self.lock:
            touched, self.touched = self.touched, {}
            if not touched:
                return None
            return [self.families[name]._snapshot(keys) for name, keys in touched.items()]


registry = _Registry()


def _finite(value: object, what: str) -> float:
    """``value`` as a float, or MetricsError when it is not a finite number."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise MetricsError(f"{what}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise MetricsError(f"{what}: {value!r} is not a finite number")
    return number


def _labels(name: str, labels: dict[str, str] | None) -> dict[str, str]:
    labels = dict(labels or {})
    for label, value in labels.items():
        if (
            not isinstance(label, str)
            or not _LABEL.fullmatch(label)
            or label == "le"
            or label.startswith("__")
        ):
            raise MetricsError(f"metric {name!r}: label name {label!r} is not allowed")
        if not isinstance(value, str):
            raise MetricsError(f"metric {name!r}: label {label!r} must be a string")
    return labels


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
        self._metrics: dict[Labels, CustomMetric] = {}
        with registry.lock:
            known = registry.families.get(name)
            if known is not None and (known.kind, known.description) != (
                self.kind,
                self.description,
            ):
                raise MetricsError(
                    f"metric family {name!r} exists already with another kind or description"
                )
            if known is None and len(registry.families) >= MAX_FAMILIES:
                raise MetricsError(
                    f"metric family {name!r}: a model may make {MAX_FAMILIES} families at most"
                )
            if known is not None:
                self._metrics = known._metrics  # the same family, made again: one set of values
            registry.families[name] = self
            registry.touch(name)

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> CustomMetric:
        """The family's metric of ``labels`` (made on first use); a histogram's needs its
        ``buckets`` (upper bounds: finite, increasing)."""
        labels = _labels(self.name, labels)
        key = tuple(sorted(labels.items()))
        with registry.lock:
            metric = self._metrics.get(key)
            if metric is None:
                if len(self._metrics) >= MAX_METRICS_PER_FAMILY:
                    raise MetricsError(
                        f"metric family {self.name!r}: {MAX_METRICS_PER_FAMILY} label sets at most"
                    )
                metric = self._metrics[key] = CustomMetric(self, labels, buckets)
                registry.touch(self.name, key)
        return metric

    def _snapshot(self, keys: Iterable[Labels] | None = None) -> dict[str, Any]:
        """The family as plain data: all its metrics, or those of ``keys``."""
        metrics = self._metrics.values() if keys is None else [self._metrics[k] for k in keys]
        return {
            "name": self.name,
            "description": self.description,
            "kind": self.kind,
            "metrics": [m._snapshot() for m in metrics],
        }


def _bounds(name: str, buckets: list[float] | None) -> list[float]:
    """A histogram's upper bounds: at least one, finite, strictly increasing."""
    what = f"histogram {name!r} bucket"
    bounds = [_finite(b, what) for b in buckets or ()]
    if not bounds or any(b >= c for b, c in itertools.pairwise(bounds)):
        raise MetricsError(f"histogram {name!r} needs buckets: upper bounds, finite and increasing")
    return bounds


class CustomMetric:
    """One metric of a family: ``increment`` (counter, gauge), ``set`` (gauge), ``value``
    (counter, gauge), ``observe`` (histogram)."""

    def __init__(
        self, family: MetricFamily, labels: dict[str, str], buckets: list[float] | None
    ) -> None:
        self._family = family
        self._labels = labels
        self._key: Labels = tuple(sorted(labels.items()))
        self._value = 0.0
        self._stamp = 0
        """A gauge's last change (``time.monotonic_ns``; 0: never)."""
        self._bounds: list[float] = []
        if family.kind == "histogram":
            self._bounds = _bounds(family.name, buckets)
        elif buckets is not None:
            raise MetricsError(f"metric {family.name!r}: only a histogram takes buckets")
        self._counts = [0] * (len(self._bounds) + 1)  # the last: above every bound
        self._sum = 0.0

    def _only(self, *kinds: str, what: str) -> None:
        if self._family.kind not in kinds:
            raise MetricsError(f"{what} is not for a {self._family.kind} ({self._family.name!r})")

    def _number(self, value: object, what: str) -> float:
        return _finite(value, f"{what} of {self._family.name!r}")

    def _changed(self) -> None:
        """Note a change (the caller holds the registry's lock)."""
        self._stamp = time.monotonic_ns()
        registry.touch(self._family.name, self._key)

    def increment(self, value: float) -> None:
        self._only("counter", "gauge", what="increment")
        amount = self._number(value, "increment")
        if self._family.kind == "counter" and amount < 0:
            raise MetricsError(f"counter {self._family.name!r} cannot go down ({value})")
        with registry.lock:
            total = self._value + amount
            if not math.isfinite(total):
                raise MetricsError(f"metric {self._family.name!r} would pass a float's range")
            self._value = total
            self._changed()

    def set(self, value: float) -> None:
        self._only("gauge", what="set")
        number = self._number(value, "set")
        with registry.lock:
            self._value = number
            self._changed()

    def value(self) -> float:
        self._only("counter", "gauge", what="value")
        return self._value

    def observe(self, value: float) -> None:
        self._only("histogram", what="observe")
        number = self._number(value, "observe")
        with registry.lock:
            total = self._sum + number
            if not math.isfinite(total):
                raise MetricsError(f"histogram {self._family.name!r}: its sum would overflow")
            self._counts[bisect.bisect_left(self._bounds, number)] += 1
            self._sum = total
            self._changed()

    def _snapshot(self) -> dict[str, Any]:
        if self._family.kind == "gauge":
            return {"labels": self._labels, "value": self._value, "stamp": self._stamp}
        if self._family.kind == "counter":
            return {"labels": self._labels, "value": self._value}
        return {
            "labels": self._labels,
            "buckets": self._bounds,
            "counts": list(self._counts),
            "sum": self._sum,
        }
