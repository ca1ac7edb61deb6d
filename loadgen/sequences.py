"""Sequences for a stateful model's load: each concurrent client runs one sequence at a time.

A target asks ``take`` for the next request's place before it sends (a sequence no one is
sending on, or a new one) and hands it back when the answer is in (``give_back``), so a
sequence never has two requests in flight and its requests go in order, as Triton's
perf_analyzer sends them in its sequence mode. Every sequence is ``length`` requests, START
on the first, END on the last; ids start at a random base, so two runs against the same
deployment do not share a sequence. A request that failed ends its sequence: the next one
starts a new id (the server may have let the old one go).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Slot:
    """One sequence being sent: its id and the index of its next request."""

    key: int
    step: int = 0


class SequenceSteps:
    """The sequences of one target's load."""

    def __init__(self, length: int, seed: int | None = None) -> None:
        if length < 1:
            raise ValueError(f"a sequence is at least one request long, not {length}")
        self.length = length
        self._next_key = random.Random(seed).randrange(1, 1 << 40) << 16
        self._free: deque[Slot] = deque()
        self.started = 0

    def _new_key(self) -> int:
        self._next_key += 1
        self.started += 1
        return self._next_key

    def take(self) -> tuple[Slot, dict[str, Any]]:
        """A sequence to send on, and the next request's sequence parameters."""
        slot = self._free.popleft() if self._free else Slot(self._new_key())
        params = {
            "sequence_id": slot.key,
            "sequence_start": slot.step == 0,
            "sequence_end": slot.step == self.length - 1,
        }
        return slot, params

    def give_back(self, slot: Slot, ok: bool) -> None:
        """The request sent on ``slot`` is answered (``ok``: successfully)."""
        slot.step += 1
        if not ok or slot.step == self.length:
            slot.key, slot.step = self._new_key(), 0
        self._free.append(slot)
