"""A model's own metric settings: Triton's ``model_metrics`` in config.pbtxt.

    model_metrics {
      metric_control: [ {
        metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
        histogram_options: { buckets: [ 1, 10, 100, 1000 ] }
      } ]
    }

Each ``metric_control`` sets the bucket bounds of one histogram family for this model.
The family a model can tune is the one Triton's core lets it tune, its only per-model
histogram: ``nv_inference_first_response_histogram_ms`` (decoupled models). As in Triton,
a later control of the same family wins, and a family that cannot be tuned changes
nothing: the worker that serves the model logs a warning naming it when it starts
(``warn_unknown_families``). Bounds must be finite and increasing, at least one of them: a
histogram without them cannot be served, so such a config is a ``bad_config``.
"""

from __future__ import annotations

import itertools
import logging
import math

from tritonclient.grpc import model_config_pb2 as mc

from plaza.errors import ConfigError
from plaza.naming import METRIC_FIRST_RESPONSE_HISTOGRAM

log = logging.getLogger(__name__)

Buckets = tuple[float, ...]

DEFAULT_BUCKETS: dict[str, Buckets] = {
    METRIC_FIRST_RESPONSE_HISTOGRAM: (100.0, 500.0, 2000.0, 5000.0),
}
"""The histogram families a model may tune, with their bounds when it does not (Triton's)."""


def histogram_buckets(config: mc.ModelConfig, source: str) -> dict[str, Buckets]:
    """Every tunable family's bucket bounds for the model of ``config``."""
    buckets = dict(DEFAULT_BUCKETS)
    for i, control in enumerate(config.model_metrics.metric_control):
        family = control.metric_identifier.family
        if family not in buckets:
            continue
        where = f"model_metrics.metric_control[{i}].histogram_options.buckets"
        bounds = tuple(float(b) for b in control.histogram_options.buckets)
        if not bounds:
            raise ConfigError.at(source, where, f"{family} needs at least one bucket bound")
        if not all(math.isfinite(b) for b in bounds):
            raise ConfigError.at(source, where, f"bounds must be finite numbers, not {bounds}")
        if any(b <= a for a, b in itertools.pairwise(bounds)):
            raise ConfigError.at(source, where, f"bounds must increase, not {list(bounds)}")
        buckets[family] = bounds
    return buckets


def unknown_families(config: mc.ModelConfig) -> list[str]:
    """The families named in ``model_metrics`` that a model cannot tune (ignored)."""
    return [
        c.metric_identifier.family
        for c in config.model_metrics.metric_control
        if c.metric_identifier.family not in DEFAULT_BUCKETS
    ]


def warn_unknown_families(config: mc.ModelConfig) -> None:
    """Log the families of ``config``'s ``model_metrics`` that change nothing (as Triton)."""
    for family in unknown_families(config):
        log.warning(
            "model %s: metric family %r in model_metrics is not one a model can tune (%s); ignored",
            config.name,
            family,
            ", ".join(DEFAULT_BUCKETS),
        )
