"""What the store drills count (bench/scenarios/drill.py): each request's end as its client saw it,
per kind of request, within a phase of the drill; the ledger against the clients' own counts; the
seconds to recover. Pure: the drill's threads give it what they saw, the database what it holds."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Iterable, Optional

# How a request ended, in the table's order. A refusal is proper only as the platform promises it:
# 503 with Retry-After and a message naming the failing store; any other 503 is `bad 503`.
ENDS = ("served", "refused", "bad 503", "failed", "500", "hung")


@dataclass
class Seen:
    """One request as its client saw it (a drill.Request gives these fields)."""

    kind: str
    started: float                      # time.time() of the send
    ended: Optional[float]              # of the reply's end, or of the client's giving up; None: not yet
    status: Optional[int]
    retry_after: Optional[str] = None
    message: str = ""
    failure: Optional[str] = None       # the client's exception (a timeout, a cut connection)
    request_id: Optional[str] = None
    completion_tokens: Optional[int] = None  # what the reply's usage said (billable requests only)


def end_of(seen: Seen, deadline_s: float, store_words: Iterable[str]) -> str:
    """The request's end: `hung` past its deadline (or never ended, or the client's timeout) whatever came
    after; `failed` if the client saw no reply (a cut connection); then by status."""
    if seen.ended is None or seen.ended - seen.started > deadline_s or "Timeout" in (seen.failure or ""):
        return "hung"
    if seen.failure is not None:
        return "failed"
    if seen.status == 500:
        return "500"
    if seen.status in (200, 201):
        return "served"
    if seen.status == 503:
        named = all(word in seen.message for word in store_words)
        return "refused" if seen.retry_after and named else "bad 503"
    return "failed"


@dataclass
class Tally:
    """Counts of ENDS for one kind in one phase, and its latencies (served requests)."""

    kind: str
    counts: dict = field(default_factory=lambda: dict.fromkeys(ENDS, 0))
    latencies: list = field(default_factory=list)

    @property
    def sent(self) -> int:
        return sum(self.counts.values())

    def latency(self) -> str:
        if not self.latencies:
            return "-"
        return f"{median(self.latencies):.2f} / {max(self.latencies):.2f}"


def tally(requests: list[Seen], since: float, until: float, deadline_s: float,
          store_words: Iterable[str] = ()) -> dict[str, Tally]:
    """Per kind, the ends of the requests *sent* in [since, until)."""
    words = tuple(store_words)
    out: dict[str, Tally] = {}
    for r in requests:
        if not since <= r.started < until:
            continue
        t = out.setdefault(r.kind, Tally(r.kind))
        end = end_of(r, deadline_s, words)
        t.counts[end] += 1
        if end == "served":
            t.latencies.append(r.ended - r.started)
    return out


def recovery_s(requests: list[Seen], cleared_at: float, deadline_s: float) -> Optional[float]:
    """Seconds from the fault's end until every kind that was not served during it is served again:
    per such kind, the end of its first request sent after `cleared_at` and served; None if a kind
    never was. 0 when every kind was served throughout."""
    hurt = {r.kind for r in requests if r.started < cleared_at and end_of(r, deadline_s, ()) != "served"}
    worst = 0.0
    for kind in sorted(hurt):
        back = [r.ended for r in requests if r.kind == kind and r.started >= cleared_at
                and end_of(r, deadline_s, ()) == "served"]
        if not back:
            return None
        worst = max(worst, min(back) - cleared_at)
    return round(worst, 1)


@dataclass
class LedgerCheck:
    """The ledger's rows for the drill's tenants against what their clients received."""

    served: int       # billable requests served (their clients got a reply with usage)
    rows: int         # ledger rows of the drill's tenants
    lost: int         # served, no row
    extra: int        # rows for no served request (a refused or unknown request billed), or billed twice
    tokens_off: int   # rows whose completion tokens differ from the reply's usage

    @property
    def exact(self) -> bool:
        return not (self.lost or self.extra or self.tokens_off)

    def cell(self) -> str:
        return f"{self.rows}/{self.served}, lost {self.lost}, extra {self.extra}, tokens off {self.tokens_off}"


def check_ledger(billable: list[Seen], rows: dict[str, int], row_count: int) -> LedgerCheck:
    """`billable`: the drill's chat requests; `rows`: request_id -> completion tokens of the ledger's
    rows for the drill's tenants, `row_count` how many rows those were (a request id twice would show
    as row_count > len(rows))."""
    served = {r.request_id: r for r in billable if r.status == 200 and r.request_id}
    lost = sum(1 for i in served if i not in rows)
    extra = sum(1 for i in rows if i not in served) + (row_count - len(rows))
    off = sum(1 for i, r in served.items() if i in rows and rows[i] != r.completion_tokens)
    return LedgerCheck(served=len(served), rows=row_count, lost=lost, extra=extra, tokens_off=off)


def fault_rows(drill: str, seen: list[Seen], marks: tuple[float, float, float, float], deadline_s: float,
               store_words: Iterable[str], ledger: LedgerCheck, ledger_after_s: float) -> list[dict]:
    """The drill's rows, one per kind: its ends among the requests sent during the fault, latencies
    (p50 / max of served) before and during it, served after it; 500s, hangs and improper 503s over
    the whole run; on the first row, the seconds to recover and the ledger. `marks`: time.time() of
    the load's start, the fault, its end, the load's end."""
    began, faulted, cleared, ended = marks
    words = tuple(store_words)
    phases = [tally(seen, since, until, deadline_s, words)
              for since, until in ((began, faulted), (faulted, cleared), (cleared, ended), (began, ended))]
    rows = []
    for kind in dict.fromkeys(s.kind for s in seen):
        before, during, after, whole = (phase.get(kind, Tally(kind)) for phase in phases)
        rows.append({"drill": "" if rows else drill, "kind": kind, "sent during": during.sent,
                     **{end: during.counts[end] for end in ENDS},
                     "p50 / max s before": before.latency(), "p50 / max s during": during.latency(),
                     "after: served": f"{after.counts['served']}/{after.sent}",
                     "whole run: 500 / hung / bad 503":
                         f"{whole.counts['500']} / {whole.counts['hung']} / {whole.counts['bad 503']}"})
    if rows:
        back = recovery_s(seen, cleared, deadline_s)
        rows[0]["recovery s"] = "never" if back is None else back
        rows[0]["ledger rows / served"] = f"{ledger.cell()} ({ledger_after_s:.0f} s after the load)"
    return rows
