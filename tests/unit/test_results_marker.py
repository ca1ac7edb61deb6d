"""What a job marker says of its model (``plaza.results.marked_decoupled``)."""

from __future__ import annotations

from plaza.results import marked_decoupled


def test_a_marker_says_decoupled_only_where_it_was_told() -> None:
    assert marked_decoupled(b"words 1") is True
    assert marked_decoupled(b"mlp 0") is False
    assert marked_decoupled(b"mlp") is None  # a submitter that knew no config, or older
    assert marked_decoupled(None) is None
