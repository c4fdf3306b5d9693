"""QualityRepository: quality runs and overrides. Reads are scoped to a tenant; a run's moves are
conditional UPDATEs, so two Ingress replicas driving one run never both win a step."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone
from typing import Any, Callable, Optional

from sqlalchemy import Engine, select, update

from loraplex.db.migrations import migrate
from loraplex.quality import gate
from loraplex.quality.tables import MIGRATIONS
from loraplex.quality.tables import quality_overrides as o
from loraplex.quality.tables import quality_runs as r

ACTIVE = ("queued", "generating", "scoring")
MOVES = {"generating": ("queued",), "scoring": ("generating",), "completed": ("generating", "scoring"),
         "failed": ACTIVE}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class QualityRepository:
    def __init__(self, db: Engine, clock: Callable[[], datetime] = utcnow):
        self.db, self.clock = db, clock
        migrate(db, MIGRATIONS)

    def create(self, tenant: str, api_key_id: Optional[str], endpoint: str, input_file_id: str,
               reference: tuple[str, str, Optional[str]], candidate: tuple[str, str, Optional[str]],
               metadata: Optional[dict] = None) -> dict:
        """`reference` / `candidate`: (as named, base, adapter name or None)."""
        row = {"id": f"qrun_{uuid.uuid4().hex}", "tenant_id": tenant, "api_key_id": api_key_id, "status": "queued",
               "endpoint": endpoint, "input_file_id": input_file_id,
               "reference": reference[0], "reference_base": reference[1], "reference_adapter": reference[2],
               "candidate": candidate[0], "candidate_base": candidate[1], "candidate_adapter": candidate[2],
               "metadata": metadata or None, "created_at": self.clock()}
        with self.db.begin() as conn:
            conn.execute(r.insert().values(**row))
        return self.get(tenant, row["id"])

    def get(self, tenant: Optional[str], run_id: str) -> Optional[dict]:
        q = select(r).where(r.c.id == run_id)
        if tenant is not None:
            q = q.where(r.c.tenant_id == tenant)
        with self.db.connect() as conn:
            row = conn.execute(q).mappings().first()
        return dict(row) if row else None

    def list(self, tenant: str, limit: int = 20) -> list[dict]:
        with self.db.connect() as conn:
            return [dict(x) for x in conn.execute(select(r).where(r.c.tenant_id == tenant).order_by(
                r.c.created_at.desc(), r.c.id).limit(limit)).mappings()]

    def active(self, limit: int = 50) -> list[dict]:
        with self.db.connect() as conn:
            return [dict(x) for x in conn.execute(select(r).where(r.c.status.in_(ACTIVE)).order_by(
                r.c.created_at).limit(limit)).mappings()]

    def move(self, run_id: str, new: str, **values: Any) -> bool:
        if new in ("completed", "failed"):
            values["completed_at"] = self.clock()
        with self.db.begin() as conn:
            return conn.execute(update(r).where(r.c.id == run_id, r.c.status.in_(MOVES[new]))
                                .values(status=new, **values)).rowcount == 1

    # -- the gate --------------------------------------------------------------------------------
    def add_override(self, tenant: str, adapter: Optional[str], to_base: str, reason: str) -> dict:
        row = {"id": f"qovr_{uuid.uuid4().hex}", "tenant_id": tenant, "adapter": adapter, "to_base": to_base,
               "reason": reason, "created_at": self.clock()}
        with self.db.begin() as conn:
            conn.execute(o.insert().values(**row))
        return row

    def overrides(self, tenant: str) -> list[dict]:
        with self.db.connect() as conn:
            return [dict(x) for x in conn.execute(select(o).where(o.c.tenant_id == tenant)
                                                  .order_by(o.c.created_at.desc())).mappings()]

    def check_move(self, move: gate.Move, cheaper: Callable[[str, str], bool] = lambda to, frm: True) -> None:
        """gate.check against the tenant's finished runs and overrides on record."""
        with self.db.connect() as conn:
            runs = conn.execute(select(r).where(r.c.tenant_id == move.tenant, r.c.status == "completed")
                                .order_by(r.c.completed_at.desc())).mappings().all()
        records = [gate.RunRecord(x["id"], x["tenant_id"], x["reference_base"], x["reference_adapter"],
                                  x["candidate_base"], x["candidate_adapter"], bool(x["passed"]), x["summary"] or "")
                   for x in runs]
        overrides = [gate.Override(x["tenant_id"], x["adapter"], x["to_base"], x["reason"])
                     for x in self.overrides(move.tenant)]
        gate.check(move, records, overrides, cheaper)


def run_object(row: dict) -> dict:
    """The run as the API shows it (status names follow the `openai` SDK's eval runs where they can)."""
    report = row.get("report") or {}

    def epoch(t):
        return int(t.timestamp()) if t is not None else None

    return {"id": row["id"], "object": "quality.run", "status": row["status"], "endpoint": row["endpoint"],
            "input_file_id": row["input_file_id"], "reference": row["reference"], "candidate": row["candidate"],
            "reference_base": row["reference_base"], "candidate_base": row["candidate_base"],
            "batch_ids": [b for b in (row["generation_batch_id"], row["scoring_batch_id"]) if b],
            "result_counts": report.get("result_counts"), "figures": report.get("figures"),
            "thresholds": report.get("thresholds"), "problems": report.get("problems"),
            "passed": row["passed"], "verdict": row["summary"], "error": row["error"],
            "metadata": row["metadata"], "created_at": epoch(row["created_at"]),
            "completed_at": epoch(row["completed_at"])}
