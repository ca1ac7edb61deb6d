"""A model table entry keeps the configs of its previous generations, newest first and at
most ``MAX_PREVIOUS`` (``previous_served``), so that a gateway can pick the one a live worker
runs; a refused generation never ran and is never among them. Pure logic."""

from __future__ import annotations

import json

from plaza.model_control import MAX_PREVIOUS, DesiredModel, ServedConfig, previous_served


def entry(generation: int, config: str, *previous: int, failed: str = "") -> DesiredModel:
    kept = tuple(ServedConfig(g, f"config-{g}") for g in previous)
    return DesiredModel("m", True, generation, config, failed=failed, previous=kept)


def generations(kept: tuple[ServedConfig, ...]) -> list[int]:
    return [served.generation for served in kept]


def test_a_reload_keeps_the_replaced_generation_and_those_before_it() -> None:
    assert generations(previous_served(entry(2, "config-2", 1), None)) == [2, 1]
    full = entry(9, "config-9", *range(8, 8 - MAX_PREVIOUS, -1))
    assert generations(previous_served(full, None)) == list(range(9, 9 - MAX_PREVIOUS, -1))


def test_a_refused_generation_is_not_kept() -> None:
    assert generations(previous_served(entry(3, "config-3", 2, 1, failed="no"), None)) == [2, 1]


def test_nothing_is_kept_for_a_first_load_or_after_an_unload() -> None:
    assert previous_served(None, None) == ()
    assert previous_served(DesiredModel("m", False, 4), None) == ()


def test_an_entry_reads_back_as_written_and_reads_the_one_field_of_an_older_one() -> None:
    written = entry(5, "config-5", 4, 3)
    assert DesiredModel.decode("m", written.encode()) == written
    older = {"loaded": True, "generation": 5, "config": "c", "previous_generation": 4}
    older |= {"previous_config": "config-4", "previous_versions": [1]}
    assert DesiredModel.decode("m", json.dumps(older)).previous == (
        ServedConfig(4, "config-4", (1,)),
    )
    bare = {"loaded": True, "generation": 5, "config": "c"}
    assert DesiredModel.decode("m", json.dumps(bare)).previous == ()
