"""The one priority rule: which level a request's ``priority`` runs at (Triton's rule).

A model with ``priority_levels: N`` has levels 1 (highest) to N. A request's ``priority``
0, or one above N, runs at the model's ``default_priority_level``; a negative one is
InvalidInput. A model without levels runs everything at level 0. The batcher, the producer
core and the worker all settle a priority through ``settle_level``, so they never disagree.
"""

from __future__ import annotations

from plaza.errors import InvalidInput


def settle_level(priority: int, levels: int, default_level: int) -> int:
    """The level ``priority`` runs at, for a model with ``levels`` priority levels.

    ``default_level`` is the model's ``default_priority_level`` (config parsing keeps it in
    1..levels; 0 falls back to the lowest level, N). Raises InvalidInput for a negative
    priority, which no model accepts.
    """
    if priority < 0:
        raise InvalidInput(f"priority {priority} is negative; use 0 for the model's default")
    if levels <= 0:
        return 0
    if 1 <= priority <= levels:
        return priority
    return default_level if 1 <= default_level <= levels else levels
