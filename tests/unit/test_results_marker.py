"""What a job marker says of its model (``plaza.results.read_marker``)."""

from __future__ import annotations

from plaza.results import read_marker


def test_a_marker_says_decoupled_only_where_it_was_told() -> None:
    assert read_marker(b"words 1")[0] is True
    assert read_marker(b"mlp 0")[0] is False
    assert read_marker(b"mlp")[0] is None  # a submitter that knew no config, or older
    assert read_marker(None)[0] is None
