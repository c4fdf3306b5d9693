"""docs/metrics.md lists every metric of the catalog, as exported, with its type and labels: the
contract the alert rules and the dashboard are written against."""

import re
from pathlib import Path

import pytest

from loraplex.metrics import catalog as c
from loraplex.metrics.request_metrics import OUTCOMES

DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(ray_loraplex_[a-z0-9_]+)` \| (counter|gauge|histogram) \|([a-z_, ]*)\|")


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            labels = tuple(x.strip() for x in m.group(3).split(",") if x.strip())
            rows[m.group(1)] = (m.group(2), labels)
    return rows


@pytest.mark.parametrize("spec", c.ALL, ids=lambda s: s.name)
def test_every_metric_is_documented_under_its_exported_name(spec):
    assert documented().get(spec.exported) == (spec.kind, spec.labels)


def test_nothing_is_documented_that_is_not_recorded():
    assert set(documented()) == {spec.exported for spec in c.ALL}


def test_the_status_values_are_documented():
    text = DOC.read_text()
    assert all(f"| `{o}` |" in text for o in OUTCOMES)
