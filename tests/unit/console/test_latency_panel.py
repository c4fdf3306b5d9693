"""The admin console's latency panel shows GET /admin/latency's `classes` (issue 51): one row per SLO
class with a column for every field the route returns for a class (targets, availability,
attainment, goodput, per tenant), and the goodput of all classes. A field added to the route but
not to the panel, or the panel's table taken away, fails here (no JS runs in the unit tests: the
browser test shows the rows; see docs/console.md)."""

import re

from test_latency_route import ADMIN, build

from loraplex.console import STATIC_DIR

JS = (STATIC_DIR / "admin.js").read_text()
HTML = (STATIC_DIR / "admin.html").read_text()
CLASSES = {"interactive": {"ttft_p95_s": 1.0, "tpot_p95_s": 0.3, "availability": 0.995}, "batch": {}}


def class_fields() -> list[str]:
    """The `classes` fields the panel has a column for, in order: CLASS_FIELDS in admin.js."""
    listed = JS[JS.index("const CLASS_FIELDS = ["):]
    return re.findall(r'^  \["(\w+)", ', listed[:listed.index("\n];")], re.M)


def classes_table() -> str:
    return HTML[HTML.index('<table id="classes-table">'):HTML.index("</table>", HTML.index('<table id="classes-table">'))]


def test_every_field_of_a_class_has_a_column(tmp_path):
    client, _, acc = build(tmp_path, {"slo": {"classes": CLASSES, "default_class": "interactive"}})
    body = client.get("/admin/latency", headers=ADMIN).json()
    acc.close()
    assert set(body["classes"]) == set(CLASSES)  # one row each: the panel renders every entry
    for entry in body["classes"].values():
        assert set(class_fields()) == set(entry), "a `classes` field of /admin/latency has no column in the panel"
    assert "goodput_tokens_per_s" in body and "body.goodput_tokens_per_s" in JS and 'id="classes-goodput"' in HTML


def test_the_class_table_has_the_columns_the_rows_fill():
    head = classes_table()[:classes_table().index("</thead>")]
    columns = len(re.findall(r"<th scope=\"col\"", head))
    assert columns == 1 + len(class_fields()) + 1  # Class, one per field, Status
    assert re.search(rf'fillRows\(\$\("#classes-table tbody"\), rows, "[^"]+", {columns}\)', JS)
    assert "renderClasses(body);" in JS[JS.index("async function loadLatency"):JS.index("// -- latency per SLO class")]
