"""A job marker's view of its answer (``plaza.results.JobView``, ``marker_value``,
``read_marker``): what the gateway keeps of a job's request for its poll."""

from __future__ import annotations

from plaza.results import JobView, marker_value, read_marker


def test_a_view_travels_in_the_marker_and_back() -> None:
    view = JobView("my label, with spaces", True, {"OUTPUT0": False})
    for decoupled in (False, True, None):
        assert read_marker(marker_value("add_sub", decoupled, view)) == (decoupled, view)


def test_a_default_view_leaves_the_marker_as_it_was() -> None:
    assert marker_value("mlp", False, JobView()) == b"mlp 0"
    assert marker_value("mlp", None) == b"mlp"
    assert read_marker(b"words 1") == (True, JobView())
    assert read_marker(None) == (None, JobView())


def test_an_output_says_first_then_the_request_then_the_poll() -> None:
    view = JobView(outputs={"A": True, "B": False})
    assert view.wants_binary("A") and not view.wants_binary("B", asked=True)
    assert not view.wants_binary("C") and view.wants_binary("C", asked=True)
    assert JobView(binary_output=True).wants_binary("C")


def test_a_view_that_does_not_read_is_the_default() -> None:
    assert read_marker(b"mlp 0 {not json") == (False, JobView())
    assert read_marker(b'mlp 0 ["a list"]') == (False, JobView())
