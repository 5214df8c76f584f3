"""The metrics table (docs/metrics.md) lists exactly the metric families txstage serves.

Operators read the table, not metrics.py; a metric added, renamed or relabelled
without updating it fails here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics import MetricWrapperBase

from service.observability.metrics import HotHistogram, Metrics
from service.observability.txn_states import NAME, TransactionStates

README = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"  # the reference
START, END = "<!-- metrics:start -->", "<!-- metrics:end -->"


@dataclass(frozen=True)
class Family:
    name: str  # as served: counters with _total, Info with _info
    type: str  # counter, gauge, histogram, info
    labels: frozenset[str]


def served_name(metric: MetricWrapperBase) -> str:
    """The family name a scraper sees (text format 0.0.4)."""
    suffix = {"counter": "_total", "info": "_info"}.get(metric._type, "")
    return metric._name + suffix


def label_names(metric: MetricWrapperBase, metrics: Metrics) -> frozenset[str]:
    """Declared label names; an Info's labels are the keys ``describe_build`` sets."""
    if metric._type != "info":
        return frozenset(metric._labelnames)
    metrics.describe_build("exactly_once", "g")
    [sample] = [s for s in metric.collect()[0].samples if s.name == served_name(metric)]
    return frozenset(sample.labels)


def registered_families() -> set[Family]:
    metrics = Metrics(CollectorRegistry())
    wrappers = [v for v in vars(metrics).values() if isinstance(v, MetricWrapperBase)]
    hot = [v for v in vars(metrics).values() if isinstance(v, HotHistogram)]
    states = [v for v in vars(metrics).values() if isinstance(v, TransactionStates)]
    return {Family(served_name(m), m._type, label_names(m, metrics)) for m in wrappers} | {
        Family(h.name, "histogram", frozenset()) for h in hot} | {
        Family(NAME, "gauge", frozenset({"state"})) for _ in states}


def served_type_lines() -> set[str]:
    """Family names from the ``# TYPE`` lines of a real scrape: the ground truth for names.

    prometheus_client adds a ``<name>_created`` gauge beside each counter and
    histogram (when the series started); the README says so once, not per row. The
    standard ``process_*`` and ``python_*`` families are one sentence under the table.
    """
    return {name for name in _all_type_lines()
            if name.startswith("txstage_") and not name.endswith("_created")}


def _all_type_lines() -> set[str]:
    text = generate_latest(Metrics(CollectorRegistry()).registry).decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def test_the_standard_process_and_gc_families_are_served_and_named_in_the_readme() -> None:
    names = _all_type_lines()
    standard = {"process_cpu_seconds_total", "process_resident_memory_bytes",
                "python_gc_collections_total", "python_info"}
    assert standard <= names
    after_table = README.read_text(encoding="utf-8").split(END)[1].split("\n## ")[0]
    for name in standard:
        assert f"`{name}" in after_table, f"{name} is not named under the metrics table"


def table_rows(readme: str) -> list[list[str]]:
    if readme.count(START) != 1 or readme.count(END) != 1:
        pytest.fail(f"docs/metrics.md must contain {START} and {END} exactly once")
    block = readme.split(START, 1)[1].split(END, 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def parse_family(row: list[str]) -> Family:
    name, type_, labels = (cell.strip("`") for cell in row[:3])
    names = frozenset(re.findall(r"`([a-z_]+)`", row[2]))
    if labels != "—" and not names:
        pytest.fail(f"labels of {name} must be backticked names or —, got {row[2]!r}")
    return Family(name, type_, names)


def documented_families() -> list[Family]:
    return [parse_family(row) for row in table_rows(README.read_text(encoding="utf-8"))]


def test_served_names_match_the_suffix_rules() -> None:
    assert {f.name for f in registered_families()} == served_type_lines()


def test_readme_lists_every_metric_family_exactly_once() -> None:
    names = [f.name for f in documented_families()]
    assert sorted(names) == sorted(set(names)), "a metric is listed twice"
    assert set(names) == {f.name for f in registered_families()}


def test_readme_types_and_labels_match_the_registry() -> None:
    registered = {f.name: f for f in registered_families()}
    for documented in documented_families():
        assert documented == registered[documented.name]


def test_every_row_says_what_it_means_and_what_to_do() -> None:
    for row in table_rows(README.read_text(encoding="utf-8")):
        assert len(row) == 5, f"row needs 5 columns: {row}"
        meaning, action = row[3], row[4]
        assert len(meaning) > 20 and len(action) > 20, f"explain {row[0]} properly"


def test_table_parser_detects_a_missing_and_a_mislabelled_metric() -> None:
    """The checks above would catch drift: prove the parser sees what it must."""
    readme = README.read_text(encoding="utf-8")
    broken = re.sub(r"^\| `txstage_ready` .*\n", "", readme, flags=re.MULTILINE)
    broken = broken.replace("| `topic`, `partition` |", "| `topic` |")
    names = {parse_family(row).name for row in table_rows(broken)}
    assert "txstage_ready" not in names
    lag = [parse_family(r) for r in table_rows(broken) if r[0] == "`txstage_consumer_lag`"]
    assert lag == [Family("txstage_consumer_lag", "gauge", frozenset({"topic"}))]
