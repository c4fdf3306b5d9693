import json
from datetime import datetime, timedelta, timezone

import pytest

from loraplex.accounting.record import UsageRecord
from usage_builders import T0, make_record


def test_json_round_trip():
    rec = make_record(1, adapter="a@1")
    assert UsageRecord.from_dict(json.loads(rec.to_json())) == rec


def test_epoch_seconds_become_utc_and_ttft_is_derived():
    t = T0.timestamp()
    rec = UsageRecord(request_id="r", tenant_id="t", base_model="m", prompt_tokens=1, completion_tokens=1,
                      status="stop", arrival_time=t, first_token_time=t + 0.25, finish_time=t + 1)
    assert rec.arrival_time == T0 and rec.arrival_time.tzinfo == timezone.utc
    assert rec.ttft == pytest.approx(0.25)


@pytest.mark.parametrize("bad", [
    dict(status="weird"), dict(prompt_tokens=-1), dict(cached_prompt_tokens=101), dict(request_id=""),
    dict(cached_prompt_tokens=-1), dict(completion_tokens=-1), dict(tenant_id=""),
    dict(arrival_time=datetime(2026, 1, 1)),  # naive
])
def test_validation(bad):
    with pytest.raises(ValueError):
        make_record(1, **bad)


def test_non_utc_times_are_normalised():
    plus1 = timezone(timedelta(hours=1))
    rec = make_record(1, at=T0.astimezone(plus1))
    assert rec.arrival_time.utcoffset() == timedelta(0) and rec.arrival_time == T0


def test_parse_time_and_period_bounds():
    from loraplex.accounting.period import parse_time, period_bounds
    assert parse_time("2026-11-03") == datetime(2026, 11, 3, tzinfo=timezone.utc)
    assert parse_time("2026-11-03T10:00:00Z") == T0
    assert parse_time("2026-11-03T11:00:00 01:00") == T0  # '+' decoded to ' ' by a query string
    assert period_bounds("2026-12") == (datetime(2026, 12, 1, tzinfo=timezone.utc),
                                        datetime(2027, 1, 1, tzinfo=timezone.utc))
    with pytest.raises(ValueError):
        period_bounds("2026-1")
