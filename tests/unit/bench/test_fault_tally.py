"""The store drills' counting (bench/fault_tally.py): how a request ended, per phase and kind, the
seconds to recover, and the ledger against the clients' own counts."""

from bench.fault_tally import Seen, check_ledger, end_of, fault_rows, recovery_s, tally

WORDS = ("adapter store", "s3://b/p")


def seen(kind="base", started=0.0, took=1.0, status=200, **kw) -> Seen:
    return Seen(kind=kind, started=started, ended=None if took is None else started + took, status=status, **kw)


def test_a_proper_refusal_is_a_503_with_retry_after_naming_the_store():
    ok = seen(status=503, retry_after="10", message="The adapter store s3://b/p did not answer")
    assert end_of(ok, 60, WORDS) == "refused"
    assert end_of(seen(status=503, message=ok.message), 60, WORDS) == "bad 503"  # no Retry-After
    assert end_of(seen(status=503, retry_after="10", message="The adapter store is down"), 60, WORDS) == "bad 503"


def test_a_request_past_its_deadline_or_never_ended_is_hung_whatever_its_status():
    assert end_of(seen(took=61), 60, ()) == "hung"
    assert end_of(seen(took=None, status=None), 60, ()) == "hung"  # still running when the drill ended
    assert end_of(seen(took=60, status=None, failure="ReadTimeout('timed out')"), 60, ()) == "hung"
    assert end_of(seen(took=3, status=200, failure="RemoteProtocolError('cut')"), 60, ()) == "failed"  # cut after its headers
    assert end_of(seen(took=59), 60, ()) == "served"


def test_500s_and_other_statuses_are_counted_apart():
    assert end_of(seen(status=500), 60, ()) == "500"
    assert end_of(seen(status=429), 60, ()) == "failed"
    assert end_of(seen(status=201), 60, ()) == "served"  # an upload stored


def test_tally_counts_the_requests_sent_in_the_phase_by_kind():
    requests = [seen("base", 1), seen("base", 5, status=500), seen("upload", 6, status=201), seen("base", 10)]
    counts = tally(requests, 2, 10, 60)
    assert counts["base"].counts["500"] == 1 and counts["base"].counts["served"] == 0
    assert counts["upload"].counts["served"] == 1 and counts["upload"].latencies == [1.0]
    assert counts["base"].sent == 1  # those sent at 1 (before) and 10 (the phase's end) are not in it


def test_recovery_is_the_first_success_after_the_fault_of_the_slowest_hurt_kind():
    requests = [seen("base", 0), seen("cold", 1, status=503), seen("cold", 9, took=4), seen("cold", 11, took=1),
                seen("an upload", 2, status=503), seen("an upload", 10, took=5)]
    assert recovery_s(requests, 8, 60) == 7.0  # the upload: sent at 10, done at 15; "cold" done at 12 (sent at 9: not after)
    assert recovery_s([seen("base", 0), seen("base", 9)], 8, 60) == 0.0  # nothing was hurt
    assert recovery_s([seen("cold", 1, status=503), seen("cold", 9, status=503)], 8, 60) is None


def test_the_ledger_check_finds_lost_extra_and_wrong_rows():
    billable = [seen(request_id="a", completion_tokens=5), seen(request_id="b", completion_tokens=6),
                seen(request_id="c", completion_tokens=7), seen(status=503, request_id="d")]
    exact = check_ledger(billable, {"a": 5, "b": 6, "c": 7}, 3)
    assert exact.exact and (exact.served, exact.lost, exact.extra, exact.tokens_off) == (3, 0, 0, 0)
    check = check_ledger(billable, {"a": 5, "b": 9, "d": 3}, 4)
    assert (check.lost, check.extra, check.tokens_off) == (1, 2, 1)  # c lost; d refused yet billed, a row twice; b off


def test_fault_rows_one_per_kind_with_recovery_and_ledger_on_the_first():
    requests = [seen("base", 1, request_id="b1"), seen("cold", 2), seen("base", 11, request_id="b2"), seen("cold", 12, status=503, retry_after="10",
                                                                       message="adapter store s3://b/p"),
                seen("base", 13, took=None, status=None), seen("cold", 31, took=2), seen("base", 32, request_id="b3")]
    ledger = check_ledger([r for r in requests if r.kind == "base"], {}, 0)
    rows = fault_rows("store down", requests, (0, 10, 30, 40), 60, WORDS, ledger, 3)
    assert [r["kind"] for r in rows] == ["base", "cold"] and rows[0]["drill"] == "store down" and rows[1]["drill"] == ""
    assert (rows[0]["sent during"], rows[0]["served"], rows[0]["hung"]) == (2, 1, 1)
    assert (rows[1]["refused"], rows[1]["after: served"]) == (1, "1/1")
    assert rows[0]["recovery s"] == 3.0 and "recovery s" not in rows[1]
    assert rows[0]["whole run: 500 / hung / bad 503"] == "0 / 1 / 0"
    assert rows[0]["ledger rows / served"].startswith("0/3, lost 3")
