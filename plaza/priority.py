"""The one priority rule: which level a request's ``priority`` runs at (Triton's rule).

A model with ``priority_levels: N`` has levels 1 (highest) to N. A request's ``priority``
0, or one above N, runs at the model's ``default_priority_level``; a negative one is
InvalidInput. A model without levels runs everything at level 0. The batcher, the producer
core and the worker all settle a priority through ``settle_level``, so they never disagree.
"""

from __future__ import annotations

import operator
from typing import SupportsIndex

from plaza.errors import InvalidInput


def check_priority(priority: object) -> int:
    """``priority`` as a plain int: any integral value but a bool (numpy's ints too, through
    ``operator.index``), at least 0; InvalidInput otherwise. A float, even 2.0, is refused:
    a level's topic is named from it, and a ``.p2.0`` topic is one that no worker reads."""
    if type(priority) is int and priority >= 0:  # the usual case, at no cost
        return priority
    value = _integral(priority)
    if value is None:
        raise InvalidInput(
            f"priority must be an integer >= 0, not a {type(priority).__name__} "
            f"({repr(priority)[:80]})"
        )
    if value < 0:
        raise InvalidInput(f"priority {value} is negative; use 0 for the model's default")
    return value


def _integral(value: object) -> int | None:
    """``value`` as an int when it is an integer (not a bool, not numpy's bool either,
    whose ``__index__`` raises), else None."""
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def settle_level(priority: int, levels: int, default_level: int) -> int:
    """The level ``priority`` runs at, for a model with ``levels`` priority levels.

    ``default_level`` is the model's ``default_priority_level`` (config parsing keeps it in
    1..levels; 0 falls back to the lowest level, N). Raises InvalidInput for a priority
    that ``check_priority`` refuses (a negative one, which no model accepts, or one that is
    not an integer). The level is always a plain int.
    """
    priority = check_priority(priority)
    if levels <= 0:
        return 0
    if 1 <= priority <= levels:
        return priority
    return default_level if 1 <= default_level <= levels else levels
