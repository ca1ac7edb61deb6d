"""``pb_utils.TritonModelException``, in a module of its own so that the parts of pb_utils
kept apart (``pb_metrics``) raise the same class that model code catches."""

from __future__ import annotations


class TritonModelException(Exception):
    """What pb_utils raises, and what a model raises to fail its whole batch."""

    def message(self) -> str:
        return str(self.args[0]) if self.args else ""
