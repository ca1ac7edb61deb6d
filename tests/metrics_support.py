"""Reading Prometheus expositions in tests: samples by their names exactly as written."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample by (name as exposed, sorted labels): Triton-style counter names stay."""
    out: Samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):  # one line alone parses untyped, name as is
            for family in text_string_to_metric_families(line):
                for s in family.samples:
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: Samples, name: str, **labels: str) -> float | None:
    """The sample ``name{labels}``, or None."""
    return found.get((name, tuple(sorted(labels.items()))))


def named(found: Samples, name: str) -> Samples:
    """The samples called ``name``."""
    return {k: v for k, v in found.items() if k[0] == name}
