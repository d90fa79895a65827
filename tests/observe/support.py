"""Reading a Prometheus exposition back with the library's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of `text` by (sample name, labels); the parser refuses invalid text."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, frozenset(labels.items())))


def types(text: str) -> dict[str, str]:
    """The declared type of each family (from its `# TYPE` line)."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}
