"""The garbage collector of a long-running Plaza process: a worker or a gateway.

Both make dozens of container objects per request (dicts, lists, dataclasses), so at
Python's default thresholds (700, 10, 10) a young-generation collection runs every few
dozen requests under load, and every tenth of those scans the older generations too: in
a gateway that includes everything imported at start (grpc, protobuf, Starlette,
numpy's and ONNX's modules). A process therefore sets :data:`GC_THRESHOLDS` when it
starts (:func:`tune`) and, once it serves, moves what start-up made into the permanent
generation (:func:`freeze_startup`), which no collection scans again. Measured in
docs/benchmarks.md (Hot paths, second pass, and The gateway's collector).

Only process entry points call these (``plaza worker``, ``plaza gateway``, and the load
generator of ``plaza loadgen`` and the bench, unless run with ``--loop asyncio``): they
change interpreter-wide state, which a test or an embedding application keeps as it is.
"""

from __future__ import annotations

import gc

GC_THRESHOLDS = (20_000, 50, 100)
"""The collector's generation thresholds in a serving process (Python's: 700, 10, 10)."""


def tune() -> None:
    """Set :data:`GC_THRESHOLDS` (at process start, before anything is served)."""
    gc.set_threshold(*GC_THRESHOLDS)


def freeze_startup() -> None:
    """Collect once, then freeze every object alive: start-up's modules, models and
    clients stay out of every later collection. Call it once the process serves."""
    gc.collect()
    gc.freeze()
