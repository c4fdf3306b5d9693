"""BatchRepository: the Batch API's rows. Every read is scoped to a tenant (another tenant's file
or batch is exactly a missing one), and every state move is one conditional UPDATE."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterable, Optional

from sqlalchemy import Engine, and_, func, or_, select, update

from loraplex.batches import state
from loraplex.batches.tables import batch_files as f
from loraplex.batches.tables import batch_lines as ln
from loraplex.batches.tables import batches as b
from loraplex.db.engine import write_transaction

INPUT_PURPOSE, OUTPUT_PURPOSE = "batch", "batch_output"


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def line_request_id(batch_id: str, index: int) -> str:
    """The ledger's idempotency key of a line: the same on every run of it, so a line that runs again
    after a restart is billed once."""
    return f"{batch_id}-{index}"


class BatchRepository:
    def __init__(self, db: Engine, clock: Callable[[], datetime] = utcnow):
        self.db = db
        self.clock = clock

    # -- files -----------------------------------------------------------------------------------
    def create_file(self, tenant: str, purpose: str, filename: str, size: int, file_id: str | None = None) -> dict:
        row = {"id": file_id or new_file_id(), "tenant_id": tenant, "purpose": purpose, "filename": filename,
               "bytes": size, "created_at": self.clock(), "deleted_at": None}
        with self.db.begin() as conn:
            conn.execute(f.insert().values(**row))
        return row

    def get_file(self, tenant: str, file_id: str) -> Optional[dict]:
        with self.db.connect() as conn:
            r = conn.execute(select(f).where(f.c.id == file_id, f.c.tenant_id == tenant,
                                             f.c.deleted_at.is_(None))).mappings().first()
        return dict(r) if r else None

    def list_files(self, tenant: str, purpose: str | None = None, limit: int = 100) -> list[dict]:
        q = select(f).where(f.c.tenant_id == tenant, f.c.deleted_at.is_(None))
        if purpose:
            q = q.where(f.c.purpose == purpose)
        with self.db.connect() as conn:
            return [dict(r) for r in conn.execute(q.order_by(f.c.created_at.desc(), f.c.id).limit(limit)).mappings()]

    def delete_file(self, tenant: str, file_id: str) -> bool:
        with self.db.begin() as conn:
            done = conn.execute(update(f).where(f.c.id == file_id, f.c.tenant_id == tenant, f.c.deleted_at.is_(None))
                                .values(deleted_at=self.clock()))
        return done.rowcount == 1

    def file_usage(self, tenant: str) -> tuple[int, int]:
        """(live input files, their bytes): what max_batch_files and max_batch_file_bytes bound."""
        with self.db.connect() as conn:
            n, size = conn.execute(select(func.count(), func.coalesce(func.sum(f.c.bytes), 0)).where(
                f.c.tenant_id == tenant, f.c.deleted_at.is_(None), f.c.purpose == INPUT_PURPOSE)).one()
        return int(n), int(size)

    def file_in_use(self, tenant: str, file_id: str) -> Optional[str]:
        """A batch not yet ended whose input is the file (it must not be deleted under it)."""
        with self.db.connect() as conn:
            return conn.execute(select(b.c.id).where(b.c.tenant_id == tenant, b.c.input_file_id == file_id,
                                                     b.c.status.in_(state.IN_FLIGHT)).limit(1)).scalar()

    # -- batches ---------------------------------------------------------------------------------
    def create_batch(self, tenant: str, api_key_id: str | None, endpoint: str, input_file_id: str,
                     metadata: dict | None, window_s: int) -> dict:
        now = self.clock()
        row = {"id": f"batch_{uuid.uuid4().hex}", "tenant_id": tenant, "api_key_id": api_key_id, "endpoint": endpoint,
               "input_file_id": input_file_id, "status": "validating", "metadata": metadata or None,
               "total": 0, "completed": 0, "failed": 0, "created_at": now,
               "expires_at": now + timedelta(seconds=window_s)}
        with self.db.begin() as conn:
            conn.execute(b.insert().values(**row))
        return self.get_batch(tenant, row["id"])

    def get_batch(self, tenant: str | None, batch_id: str) -> Optional[dict]:
        q = select(b).where(b.c.id == batch_id)
        if tenant is not None:
            q = q.where(b.c.tenant_id == tenant)
        with self.db.connect() as conn:
            r = conn.execute(q).mappings().first()
        return dict(r) if r else None

    def list_batches(self, tenant: str, limit: int = 20, after: str | None = None) -> list[dict]:
        q = select(b).where(b.c.tenant_id == tenant)
        with self.db.connect() as conn:
            if after:
                anchor = conn.execute(select(b.c.created_at).where(b.c.id == after, b.c.tenant_id == tenant)).scalar()
                if anchor is not None:
                    q = q.where(or_(b.c.created_at < anchor, and_(b.c.created_at == anchor, b.c.id > after)))
            rows = conn.execute(q.order_by(b.c.created_at.desc(), b.c.id).limit(limit)).mappings()
            return [dict(r) for r in rows]

    def in_flight(self, tenant: str) -> int:
        with self.db.connect() as conn:
            return int(conn.execute(select(func.count()).where(
                b.c.tenant_id == tenant, b.c.status.in_(state.IN_FLIGHT))).scalar())

    def move(self, batch_id: str, new: str, owner: str | None = None, **values: Any) -> bool:
        """Enter `new` from any state allowed to move there (and, with `owner`, only while it holds
        the lease); stamps `<new>_at`. False: the batch was elsewhere (a cancel, another runner)."""
        if new in state.STAMP:
            values[state.STAMP[new]] = self.clock()
        cond = [b.c.id == batch_id, b.c.status.in_(state.sources_of(new))]
        if owner is not None:
            cond.append(b.c.lease_owner == owner)
        with self.db.begin() as conn:
            return conn.execute(update(b).where(*cond).values(status=new, **values)).rowcount == 1

    def cancel(self, tenant: str, batch_id: str) -> Optional[dict]:
        """Move to cancelling if it may; the batch as it is then (None: no such batch of the tenant)."""
        row = self.get_batch(tenant, batch_id)
        if row is not None and state.may_move(row["status"], "cancelling"):
            self.move(batch_id, "cancelling")
            row = self.get_batch(tenant, batch_id)
        return row

    # -- the runner's lease ----------------------------------------------------------------------
    def claim(self, owner: str, lease_s: float, skip: Iterable[str] = ()) -> Optional[dict]:
        """A runnable batch nobody holds (or whose holder's lease ran out), now leased to `owner`:
        one never worked first (oldest first), then the one whose lease ended longest ago, so
        batches take turns (`release` leaves `lease_until` at the release time). A parked batch
        (`park`) is not claimed before its `not_before`, unless its completion window ended or it was
        cancelled."""
        now = self.clock()
        with write_transaction(self.db) as conn:
            q = (select(b.c.id).where(b.c.status.in_(state.RUNNABLE),
                                      or_(b.c.lease_until.is_(None), b.c.lease_until < now, b.c.lease_owner == owner),
                                      # parked: not before its time, unless its window ended (it expires
                                      # now) or it was cancelled (its files now)
                                      or_(b.c.not_before.is_(None), b.c.not_before <= now, b.c.expires_at <= now,
                                          b.c.status != "in_progress"))
                 .order_by(b.c.lease_until.asc().nulls_first(), b.c.created_at, b.c.id).limit(1))
            skip = list(skip)
            if skip:
                q = q.where(b.c.id.not_in(skip))
            batch_id = conn.execute(q).scalar()
            if batch_id is None:
                return None
            conn.execute(update(b).where(b.c.id == batch_id).values(
                lease_owner=owner, lease_until=now + timedelta(seconds=lease_s)))
        return self.get_batch(None, batch_id)

    def renew(self, batch_id: str, owner: str, lease_s: float) -> bool:
        with self.db.begin() as conn:
            return conn.execute(update(b).where(b.c.id == batch_id, b.c.lease_owner == owner).values(
                lease_until=self.clock() + timedelta(seconds=lease_s))).rowcount == 1

    def park(self, batch_id: str, owner: str, until: datetime) -> bool:
        """No runner claims the batch before `until` (batch_tokens_per_day spent); it stays in_progress."""
        with self.db.begin() as conn:
            return conn.execute(update(b).where(b.c.id == batch_id, b.c.lease_owner == owner)
                                .values(not_before=until)).rowcount == 1

    def release(self, batch_id: str, owner: str) -> None:
        with self.db.begin() as conn:
            conn.execute(update(b).where(b.c.id == batch_id, b.c.lease_owner == owner).values(
                lease_owner=None, lease_until=self.clock()))  # free now; when it ended orders the next claims

    # -- lines -----------------------------------------------------------------------------------
    def add_lines(self, batch_id: str, lines: list) -> None:
        """The batch's lines, pending (a second call, after a restart mid-way, adds what is missing)."""
        with write_transaction(self.db) as conn:
            have = set(conn.execute(select(ln.c.line_index).where(ln.c.batch_id == batch_id)).scalars())
            rows = [{"batch_id": batch_id, "line_index": x.index, "custom_id": x.custom_id, "state": "pending",
                     "request_id": line_request_id(batch_id, x.index)} for x in lines if x.index not in have]
            if rows:
                conn.execute(ln.insert(), rows)
            conn.execute(update(b).where(b.c.id == batch_id).values(total=len(lines)))

    def pending_lines(self, batch_id: str) -> list[int]:
        with self.db.connect() as conn:
            return list(conn.execute(select(ln.c.line_index).where(ln.c.batch_id == batch_id, ln.c.state == "pending")
                                     .order_by(ln.c.line_index)).scalars())

    def finish_line(self, batch_id: str, index: int, ok: bool, status_code: int | None, result: str) -> bool:
        """Record a pending line's result and count it, in one transaction; False if it was not
        pending (already recorded: a line is never counted twice)."""
        with self.db.begin() as conn:
            done = conn.execute(update(ln).where(ln.c.batch_id == batch_id, ln.c.line_index == index,
                                                 ln.c.state == "pending")
                                .values(state="done" if ok else "error", status_code=status_code, result=result,
                                        finished_at=self.clock()))
            if done.rowcount != 1:
                return False
            counter = b.c.completed if ok else b.c.failed
            conn.execute(update(b).where(b.c.id == batch_id).values({counter: counter + 1}))
        return True

    def lines(self, batch_id: str) -> list[dict]:
        with self.db.connect() as conn:
            return [dict(r) for r in conn.execute(select(ln).where(ln.c.batch_id == batch_id)
                                                  .order_by(ln.c.line_index)).mappings()]


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"
