"""A batch input file is refused whole, naming the line, for anything that cannot run."""

import json

import pytest

from loraplex.batches.jsonl import InvalidBatchFile, parse_batch_file


def line(custom_id="a", url="/v1/chat/completions", **over):
    obj = {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "m", "messages": []}}
    obj.update(over)
    return json.dumps(obj)


def parse(*lines, max_lines=100, max_line_bytes=10_000):
    return parse_batch_file("\n".join(lines).encode(), max_lines, max_line_bytes)


def test_a_good_file_gives_its_lines_in_order_and_skips_blank_ones():
    lines = parse(line("a"), "", line("b", url="/v1/completions"))
    assert [(x.index, x.custom_id, x.url) for x in lines] == [(0, "a", "/v1/chat/completions"), (1, "b", "/v1/completions")]


@pytest.mark.parametrize("bad, words", [
    ("{nope", "Line 2 is not valid JSON"),
    ("[1]", "Line 2 is not a JSON object"),
    (line("b", url="/v1/embeddings"), "/v1/embeddings"),
    (line("b", method="GET"), "`method`"),
    (line("", ), "`custom_id`"),
    (line("a"), "used twice"),
    (line("b", body={"messages": []}), "body.model"),
    (line("b", body="x"), "`body` must be a JSON object"),
])
def test_a_bad_line_is_refused_naming_it(bad, words):
    with pytest.raises(InvalidBatchFile, match=words.replace("(", r"\(").replace("[", r"\[")):
        parse(line("a"), bad)


def test_the_bounds_hold():
    with pytest.raises(InvalidBatchFile, match="more than 1 requests"):
        parse(line("a"), line("b"), max_lines=1)
    with pytest.raises(InvalidBatchFile, match="over 20 bytes"):
        parse(line("a"), max_line_bytes=20)
    with pytest.raises(InvalidBatchFile, match="no requests"):
        parse("", " ")
    with pytest.raises(InvalidBatchFile, match="not UTF-8"):
        parse_batch_file(b"\xff\xfe", 10, 100)
