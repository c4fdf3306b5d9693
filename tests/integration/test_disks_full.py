"""The usage spool's disk full under the running platform (issue 50): every request is still served
and every one is in the ledger once, for what its client was told; nothing waits for the disk to be
freed. The session's spool is on a 64 MB tmpfs of its own (conftest.py); the test fills it to the
last byte, sends requests, frees it, sends more. (The records the spool refuses go straight into
the database at the next flush: accounting/ledger.py; below the platform,
unit/accounting/test_spool_disk_full.py.)"""

import pytest
from sqlalchemy import select

from loraplex.accounting.tables import usage_records
from small_disk import fill
from waiting import wait_until

pytestmark = pytest.mark.integration


def ask(client, model_name, i: int):
    reply = client.post("/v1/chat/completions", json={
        "model": model_name, "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": f"Name a colour, please ({i})."}]})
    assert reply.status_code == 200, reply.text
    return reply.headers["x-loraplex-request-id"], reply.json()["usage"]


def records(usage_db, served: dict):
    """The ledger rows of `served`'s requests once all are there, else None."""
    with usage_db.connect() as conn:
        found = conn.execute(select(usage_records).where(usage_records.c.request_id.in_(list(served)))).all()
    return found if len(found) == len(served) else None


def test_a_full_spool_disk_loses_no_usage_record_and_bills_none_twice(serve_app, client, model_name, usage_db):
    spool = serve_app[2]
    filler = fill(spool)
    try:
        served = dict(ask(client, model_name, i) for i in range(6))  # every one served, the disk full
        # In the database while the disk is still full: nothing waits for it to be freed.
        wait_until(lambda: records(usage_db, served), 30, "the usage records of the requests served on a full spool")
    finally:
        filler.unlink()
    served.update(ask(client, model_name, i) for i in range(6, 8))  # the disk freed
    found = wait_until(lambda: records(usage_db, served), 30, f"usage records of the {len(served)} requests")
    for row in found:  # once each (the ledger's key), for what its reply said
        usage = served[row.request_id]
        assert (row.prompt_tokens, row.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
