"""Ledger benchmark: what metering adds to each request, append throughput, spool -> DB flush.

The "request path" case times exactly what an Engine replica runs when a request ends
(engine.metering.usage_record + UsageLedger.append), side by side with the same loop doing
nothing, so the difference is the latency metering adds to a request.

    python -m bench ledger [--records 20000] [--no-postgres]
"""
import contextlib
import sys
import tempfile
import threading
import time
from datetime import datetime, timedelta, timezone

from loraplex.accounting.ledger import UsageLedger
from loraplex.accounting.record import UsageRecord

from bench.percentile import percentile
from bench.processes import ROOT
from bench.report import Table

T0 = datetime(2026, 11, 3, 10, tzinfo=timezone.utc)


def record(i: int) -> UsageRecord:
    return UsageRecord(request_id=f"bench-{i}", tenant_id=f"t{i % 50}", api_key_id="k", base_model="qwen",
                       adapter=f"a{i % 7}@1", prompt_tokens=512, cached_prompt_tokens=256, completion_tokens=128,
                       status="finished", arrival_time=T0, first_token_time=T0 + timedelta(milliseconds=80),
                       finish_time=T0 + timedelta(seconds=2), replica_id="r0")


def bench_append(db_url: str, spool: str, n: int, sync_mode: str, threads: int) -> dict:
    recs = [record(i) for i in range(n)]  # built outside the timing, as the engine glue does
    lat: list[int] = []
    with UsageLedger(db_url, spool, sync_mode=sync_mode, flush_interval_s=3600, flush_batch=10**9) as ledger:
        def work(chunk):
            local = []
            for r in chunk:
                t = time.perf_counter_ns()
                ledger.append(r)
                local.append(time.perf_counter_ns() - t)
            lat.extend(local)
        chunks = [recs[k::threads] for k in range(threads)]
        ts = [threading.Thread(target=work, args=(c,)) for c in chunks]
        start = time.perf_counter()
        [t.start() for t in ts]
        [t.join() for t in ts]
        elapsed = time.perf_counter() - start
        ledger.flush()
    return {"case": f"append sync={sync_mode} threads={threads}", "records": n, "records_per_s": n / elapsed,
            "p50_us": percentile(lat, 50) / 1000, "p99_us": percentile(lat, 99) / 1000}


def bench_request_path(db_url: str, spool: str, n: int) -> list[dict]:
    from loraplex.engine.metering import usage_record
    from loraplex.contract import AdapterTarget, EngineCall, RequestUsage

    t0 = T0.timestamp()
    adapters = [AdapterTarget(f"t/a{j}@sha", j + 1, "t", f"a{j}", "sha", f"a{j}", version=1) for j in range(7)]
    metas = [EngineCall(f"req-{i}", f"t{i % 50}", "key_1", adapters[i % 7], arrival_time=t0) for i in range(n)]
    usage = RequestUsage(512, 256, 128, "stop", "r0", t0 + 0.08, t0 + 2.0, "stop")
    rows = []
    with UsageLedger(db_url, spool, flush_interval_s=3600, flush_batch=10**9) as ledger:
        for name, on_finish in (("request path: no metering (baseline)", lambda meta: None),
                                ("request path: usage_record + append", lambda meta: ledger.append(
                                    usage_record(meta, usage, "SmolLM2-135M-Instruct")))):
            lat = []
            start = time.perf_counter()
            for meta in metas:
                t = time.perf_counter_ns()
                on_finish(meta)
                lat.append(time.perf_counter_ns() - t)
            elapsed = time.perf_counter() - start
            rows.append({"case": name, "records": n, "records_per_s": n / elapsed,
                         "p50_us": percentile(lat, 50) / 1000, "p99_us": percentile(lat, 99) / 1000})
        ledger.flush()
    return rows


def bench_flush(name: str, db_url: str, spool: str, n: int) -> dict:
    with UsageLedger(db_url, spool, flush_interval_s=3600, flush_batch=10**9) as ledger:
        for i in range(n):
            ledger.append(record(i))
        start = time.perf_counter()
        result = ledger.flush()
        elapsed = time.perf_counter() - start
        assert result.inserted == n, result
        start = time.perf_counter()
        for i in range(n):  # replay of the same records: all conflicts
            ledger.append(record(i))
        dup = ledger.flush()
        dup_elapsed = time.perf_counter() - start
        assert dup.inserted == 0, dup
    return [{"case": f"flush -> {name} (new rows)", "records": n, "records_per_s": n / elapsed},
            {"case": f"append+flush -> {name} (all duplicates)", "records": n, "records_per_s": n / dup_elapsed}]


def add_arguments(ap) -> None:
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--no-postgres", action="store_true")


def run(args, out) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from postgres import PostgresUnavailable, throwaway_postgres  # test helper: may start the cluster

    n = args.records
    rows = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        sqlite = f"sqlite:///{tmp}/bench.db"
        rows += bench_request_path(sqlite, f"{tmp}/s0", n)
        rows.append(bench_append(sqlite, f"{tmp}/s1", n, "batch", 1))
        rows.append(bench_append(sqlite, f"{tmp}/s2", n, "batch", 4))
        rows.append(bench_append(sqlite, f"{tmp}/s3", max(n // 10, 100), "always", 1))
        rows += bench_flush("sqlite", f"sqlite:///{tmp}/flush.db", f"{tmp}/s4", n)
        if not args.no_postgres:
            try:
                pg = stack.enter_context(throwaway_postgres())
                rows += bench_flush("postgres", pg, f"{tmp}/s5", n)
            except PostgresUnavailable as e:
                out.note(f"(postgres skipped: {e})")
    out.table(Table("", [("case", "case"), ("records", "records", "{:d}"), ("records_per_s", "records/s", "{:,.0f}"),
                         ("p50_us", "p50 us", "{:.1f}"), ("p99_us", "p99 us", "{:.1f}")], rows))
    base, metered = rows[0], rows[1]
    out.note(f"metering adds {metered['p50_us'] - base['p50_us']:.1f} us p50, "
             f"{metered['p99_us'] - base['p99_us']:.1f} us p99 per request")
