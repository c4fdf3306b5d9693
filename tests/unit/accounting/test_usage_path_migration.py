"""accounting v2: usage_records gains `path` (lora / merged); a v1 database keeps its rows."""

from datetime import datetime, timezone

from sqlalchemy import inspect, text

from loraplex.accounting.record import UsageRecord
from loraplex.accounting.tables import MIGRATIONS
from loraplex.db.engine import make_engine
from loraplex.db.migrations import Migration, applied_versions, migrate

V1_TABLE = """CREATE TABLE usage_records (request_id VARCHAR(128) PRIMARY KEY, tenant_id VARCHAR(64) NOT NULL,
api_key_id VARCHAR(64), base_model VARCHAR(200) NOT NULL, adapter VARCHAR(200), prompt_tokens INTEGER NOT NULL,
cached_prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, status VARCHAR(32) NOT NULL,
arrival_time DATETIME NOT NULL, first_token_time DATETIME, finish_time DATETIME NOT NULL, ttft FLOAT,
replica_id VARCHAR(128))"""


def test_a_v1_database_gets_the_path_column_and_keeps_its_rows(tmp_path):
    db = make_engine(f"sqlite:///{tmp_path}/v1.sqlite")
    migrate(db, [Migration("accounting", 1, "v1 as it was", lambda conn: conn.execute(text(V1_TABLE)))])
    with db.begin() as conn:
        conn.execute(text("INSERT INTO usage_records VALUES ('r1','t',NULL,'b','pirate@1',1,0,1,'stop',"
                          "'2026-12-01 00:00:00','2026-12-01 00:00:00','2026-12-01 00:00:01',0.1,'rep')"))
    assert "path" not in {c["name"] for c in inspect(db).get_columns("usage_records")}
    assert [(m.component, m.version) for m in migrate(db, MIGRATIONS)] == [("accounting", 2), ("accounting_batch", 1),
                                                                      ("accounting_migration", 1)]
    assert "path" in {c["name"] for c in inspect(db).get_columns("usage_records")}
    with db.connect() as conn:
        assert conn.execute(text("SELECT request_id, path FROM usage_records")).all() == [("r1", None)]
        # accounting_batch 1 (issue 36): the Batch API's flag, false for every row that was there
        assert conn.execute(text("SELECT batch FROM usage_records")).scalars().all() == [0]
        # accounting_migration 1 (issue 48): prompt work repeated by moves, 0 for every row that was there
        assert conn.execute(text("SELECT migrated_prompt_tokens FROM usage_records")).scalars().all() == [0]
    assert applied_versions(db)["accounting"] == {1, 2}


def test_a_new_database_has_the_column_from_v1_and_v2_is_a_no_op(tmp_path):
    db = make_engine(f"sqlite:///{tmp_path}/new.sqlite")
    assert [m.version for m in migrate(db, MIGRATIONS) if m.component == "accounting"] == [1, 2]
    assert "path" in {c["name"] for c in inspect(db).get_columns("usage_records")}


def test_the_path_survives_the_spool_s_json():
    now = datetime.now(timezone.utc)
    rec = UsageRecord(request_id="r", tenant_id="t", base_model="b", prompt_tokens=1, completion_tokens=1,
                      status="stop", arrival_time=now, finish_time=now, adapter="pirate@1", path="merged")
    import json

    assert UsageRecord.from_dict(json.loads(rec.to_json())).path == "merged"
    old = {k: v for k, v in json.loads(rec.to_json()).items() if k != "path"}  # spooled before v2
    assert UsageRecord.from_dict(old).path is None
