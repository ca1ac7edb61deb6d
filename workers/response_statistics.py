"""A decoupled model's responses in the statistics and metrics: Triton's ``response_stats``
and its first-response histogram.

The runner times each response of a decoupled model as the model sends it
(``ResponseTiming``) and tells the worker's metrics, which count it here:

- ``count_response`` adds it to its version's ``ModelStatistics.responses`` under its
  index within its request (``plaza.statistics.ResponseStatistics``): a success, a failure,
  a cancellation (an error response with the code ``cancelled``: a model's
  ``TritonError.CANCELLED``) or an empty final (the final flag without a response);
- ``FirstResponses`` is the histogram ``nv_inference_first_response_histogram_ms``: per
  request, the milliseconds from its intake by the worker to its first response that is
  not an empty final (Triton's time from the request's start to its first response). Its
  bucket bounds are Triton's unless the model's ``model_metrics`` sets others
  (``plaza.model_metrics``).

Only a decoupled model's responses come here; no other model pays for any of it.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from typing import NamedTuple

from plaza.contract import InferResult
from plaza.errors import Cancelled
from plaza.model_metrics import DEFAULT_BUCKETS, Buckets
from plaza.naming import METRIC_FIRST_RESPONSE_HISTOGRAM
from plaza.statistics import ModelStatistics

FIRST_RESPONSE_BUCKETS_MS = DEFAULT_BUCKETS[METRIC_FIRST_RESPONSE_HISTOGRAM]
"""Upper bounds of the first-response histogram, milliseconds (Triton's defaults)."""
_NS_PER_MS = 1_000_000


class ResponseTiming(NamedTuple):
    """How long one response of a decoupled model took, nanoseconds."""

    infer_ns: int
    """From the response's start (its request's previous response, or the start of its
    execution) to the model's send."""
    output_ns: int
    """From the model's send to the response ready for the writer (outputs reshaped and
    classified, the result made)."""
    since_request_ns: int
    """From the request's intake by the worker to the response ready."""


def count_response(stats: ModelStatistics, result: InferResult, timing: ResponseTiming) -> None:
    """Count ``result`` (a response numbered ``result.index`` within its request)."""
    entry = stats.response(result.index)
    entry.compute_infer.add(timing.infer_ns)
    if result.empty:  # no response of its own: nothing to output
        entry.empty_response.add(timing.infer_ns)
        return
    entry.compute_output.add(timing.output_ns)
    total = timing.infer_ns + timing.output_ns
    if result.error is None:
        entry.success.add(total)
    elif result.error.code == Cancelled.code:
        entry.cancel.add(total)
    else:
        entry.fail.add(total)


def is_first_response(result: InferResult) -> bool:
    """Whether ``result`` is its request's first response (an empty final is none)."""
    return result.index == 0 and not result.empty


@dataclass(slots=True)
class FirstResponses:
    """The first-response histogram of one model version."""

    bounds: Buckets = FIRST_RESPONSE_BUCKETS_MS
    """Upper bounds of the buckets, milliseconds, increasing (``+Inf`` is implied)."""
    buckets: list[int] = field(default_factory=list)
    """Observations per bucket, not cumulative: ``buckets[i]`` counts those above the bound
    before ``bounds[i]`` and at most it; the last, those above them all. The count is their
    sum, so a scrape while a thread observes still reads a histogram whose buckets never
    decrease."""
    sum_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.buckets:
            self.buckets = [0] * (len(self.bounds) + 1)

    def observe(self, ns: int) -> None:
        ms = ns / _NS_PER_MS
        self.buckets[bisect_left(self.bounds, ms)] += 1
        self.sum_ms += ms

    def cumulative(self) -> list[tuple[str, float]]:
        """Prometheus' buckets: (upper bound, observations at most it), ``+Inf`` last."""
        counts = list(self.buckets)
        bounds = [str(b) for b in self.bounds] + ["+Inf"]
        return [(bound, sum(counts[: i + 1])) for i, bound in enumerate(bounds)]
