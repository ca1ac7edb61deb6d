"""An ensemble's pruning (``needed_by``) is remembered per requested-output tuple, within a
bound, and answers exactly as ``needed_by`` does (pure logic, no services)."""

from __future__ import annotations

import itertools

import numpy as np

from plaza.client import make_request
from plaza.ensembles import EnsembleStep, needed_by, pruning
from plaza.workers.ensemble import EnsembleRunner
from tests.support import make_settings


def step(index: int, reads: dict[str, str], writes: dict[str, str]) -> EnsembleStep:
    return EnsembleStep(index, f"m{index}", -1, input_map=reads, output_map=writes)


# X -> 0 -> mid -> 1 -> OUT1;  X -> 2 -> OUT2;  mid -> 3 -> OUT3 (and aux)
STEPS = (
    step(0, {"IN": "X"}, {"OUT": "mid"}),
    step(1, {"IN": "mid"}, {"OUT": "OUT1"}),
    step(2, {"IN": "X"}, {"OUT": "OUT2"}),
    step(3, {"IN": "mid"}, {"OUT": "OUT3", "AUX": "aux"}),
)
NAMES = ("OUT1", "OUT2", "OUT3", "aux", "mid", "nothing made")


def test_the_remembered_pruning_answers_as_needed_by_for_every_output_tuple() -> None:
    pruned = pruning(STEPS)
    for size in range(len(NAMES) + 1):
        for outputs in itertools.permutations(NAMES, size):
            assert pruned(outputs) == needed_by(STEPS, outputs), outputs
            assert pruned(outputs) == needed_by(STEPS, outputs), outputs  # remembered


def test_the_same_outputs_again_reuse_the_first_answer() -> None:
    pruned = pruning(STEPS)
    first = pruned(("OUT1", "OUT2"))
    assert pruned(("OUT1", "OUT2")) is first  # not walked again
    assert pruned(("OUT3",)) == {0, 3}


def test_only_the_most_recent_output_tuples_are_kept() -> None:
    pruned = pruning(STEPS, kept=2)
    oldest = pruned(("OUT1",))
    recent = pruned(("OUT2",))
    pruned(("OUT3",))  # a third tuple: the least recently used one is forgotten
    assert pruned(("OUT3",)) == {0, 3}
    again = pruned(("OUT1",))
    assert again == oldest and again is not oldest
    assert pruned(("OUT3",)) == {0, 3}
    assert pruned(("OUT2",)) is not recent  # forgotten when OUT1 came back


def test_the_runner_prunes_requests_for_the_same_outputs_once() -> None:
    settings = make_settings("127.0.0.1:1", "redis://127.0.0.1:1/0", "prune", model="numeric_dag")
    runner = EnsembleRunner(settings)  # built, never started: no service is reached
    raw = {"RAW": np.ones((1, 512), np.float32)}
    first = runner._needed(make_request("numeric_dag", raw))
    assert first == {0, 1, 2, 3}  # no outputs named: all of the ensemble's
    assert runner._needed(make_request("numeric_dag", raw)) is first
    named = make_request("numeric_dag", raw, outputs=["COMBINED"])
    assert runner._needed(named) == first
    assert runner._needed(make_request("numeric_dag", raw, outputs=["COMBINED"])) is (
        runner._needed(named)
    )
