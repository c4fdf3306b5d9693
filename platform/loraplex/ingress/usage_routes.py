"""Usage and billing over REST: a tenant's own usage, and the admin's reports, exports, statements
and cost model. Every answer is a view of the usage ledger (the database); nothing here writes.

Time ranges are [start, end) over a request's finish_time, in UTC. `end` defaults to now and
`start` to the first instant of the UTC month `end` falls in (so no parameters = this month so
far, and `end=2026-12-01` alone = November).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.accounting.accounting import Accounting
from loraplex.accounting.billing_export import billing_export
from loraplex.accounting.cost_model import cost_model_report
from loraplex.accounting.period import month_bounds, parse_time, period_bounds
from loraplex.accounting.rejections import rejection_counts
from loraplex.accounting.report import usage_report
from loraplex.accounting.statement import monthly_statement
from loraplex.ingress.auth import check_admin
from loraplex.ingress.errors import APIError
from loraplex.ingress.tenant_context import TenantContext
from loraplex.tenancy.tenancy import Tenancy

TENANT_GROUP_BY = ("day", "hour", "adapter", "model", "batch")  # batch: online and Batch API usage apart
ADMIN_GROUP_BY = (*TENANT_GROUP_BY, "tenant")
REPORT_FORMATS = ("json", "csv")
EXPORT_FORMATS = ("jsonl", "csv")
CSV = "text/csv; charset=utf-8"
JSONL = "application/x-ndjson"
# Billing export metadata: whether every day of the period is final, and the last day included.
EXPORT_COMPLETE = "X-LoRAPlex-Export-Complete"
EXPORT_THROUGH = "X-LoRAPlex-Export-Through"
EXPORT_EVENTS = "X-LoRAPlex-Export-Events"


def _now() -> datetime:
    return datetime.now(timezone.utc)


class UsageRoutes:
    def __init__(self, accounting: Accounting, tenants: TenantContext, tenancy: Tenancy):
        self.accounting = accounting
        self.tenants = tenants
        self.tenancy = tenancy

    def routes(self) -> list[Route]:
        return [
            Route("/v1/usage", self.tenant_usage, methods=["GET"]),
            Route("/admin/usage", self.admin_usage, methods=["GET"]),
            Route("/admin/billing/export", self.billing_export, methods=["GET"]),
            Route("/admin/tenants/{tenant_id}/statement", self.statement, methods=["GET"]),
            Route("/admin/cost-model", self.cost_model, methods=["GET"]),
        ]

    # -- tenant ------------------------------------------------------------------------------
    async def tenant_usage(self, request: Request) -> Response:
        principal = await self.tenants.authenticate(request)
        q = _query(request, {"start", "end", "group_by", "format"})
        start, end = _time_range(q)
        group_by = _choice(q, "group_by", TENANT_GROUP_BY, "day")
        fmt = _choice(q, "format", REPORT_FORMATS, "json")
        acc = self.accounting
        report = await run_in_threadpool(usage_report, acc.db, acc.prices, start, end, group_by, principal.tenant_id)
        if fmt == "csv":
            return _csv(report.to_csv(), f"usage-{start.date()}-{end.date()}.csv")
        return JSONResponse(report.to_dict())

    # -- admin -------------------------------------------------------------------------------
    async def admin_usage(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        q = _query(request, {"tenant", "start", "end", "group_by", "format"})
        start, end = _time_range(q)
        group_by = _choice(q, "group_by", ADMIN_GROUP_BY, "day")
        fmt = _choice(q, "format", REPORT_FORMATS, "json")
        tenant_id = await self._known_tenant(q.get("tenant"))
        acc = self.accounting

        def query():
            # Tenants by name next to their id: the rows grouped by tenant, and the refusals.
            names = {t.id: t.name for t in self.tenancy.service.list_tenants()}
            report = usage_report(acc.db, acc.prices, start, end, group_by, tenant_id, tenant_names=names)
            return report, names, (rejection_counts(acc.db, start, end, tenant_id) if fmt == "json" else [])

        report, names, rejections = await run_in_threadpool(query)
        if fmt == "csv":
            return _csv(report.to_csv(), f"usage-{tenant_id or 'all'}-{start.date()}-{end.date()}.csv")
        # Requests refused before the engine (401/404/429/503...): diagnostics, never billed.
        # Counted per UTC hour: the hours starting in [start, end).
        return JSONResponse({**report.to_dict(), "rejections": [
            {"tenant": r.tenant_id, "tenant_name": names.get(r.tenant_id), "reason": r.reason, "count": r.count}
            for r in rejections]})

    async def billing_export(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        q = _query(request, {"period", "format", "tenant"})
        period = _period(q)
        fmt = _choice(q, "format", EXPORT_FORMATS, "jsonl")
        tenant_id = await self._known_tenant(q.get("tenant"))
        cfg = self.accounting.config
        export = await run_in_threadpool(
            billing_export, self.accounting.db, period, source=cfg.billing_source, now=_now(),
            grace=timedelta(seconds=cfg.billing_grace_s), tenant_id=tenant_id)
        headers = {EXPORT_COMPLETE: "true" if export.complete else "false", EXPORT_EVENTS: str(len(export.events)),
                   "Content-Disposition": f'attachment; filename="loraplex-billing-{period}'
                                          f'{"-" + tenant_id if tenant_id else ""}.{fmt}"'}
        if export.through is not None:  # absent: no day of the period is final yet
            headers[EXPORT_THROUGH] = export.through
        if fmt == "csv":
            return Response(export.to_csv(), media_type=CSV, headers=headers)
        return Response(export.to_jsonl(), media_type=JSONL, headers=headers)

    async def statement(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        q = _query(request, {"period", "format"})
        period = _period(q)
        fmt = _choice(q, "format", REPORT_FORMATS, "json")
        tenant_id = await self._known_tenant(request.path_params["tenant_id"])
        acc = self.accounting
        st = await run_in_threadpool(monthly_statement, acc.db, acc.prices, tenant_id, period)
        if fmt == "csv":
            return _csv(st.to_csv(), f"statement-{tenant_id}-{period}.csv")
        return JSONResponse(st.to_dict())

    async def cost_model(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        q = _query(request, {"start", "end", "model"})
        start, end = _time_range(q)
        acc = self.accounting
        cm, model = acc.config.cost_model, q.get("model")
        if model is not None:  # one base: its records, priced on the hardware of its own pool
            if model not in cm.models:
                raise APIError(400, f"No hardware is configured for the base model {model!r}: set "
                                    f"accounting.cost_model.models.{model}.gpus (the units serving its pool); "
                                    f"configured: {', '.join(cm.models) or 'none'}.", param="model")
            cm = cm.for_model(model)
        report = await run_in_threadpool(cost_model_report, acc.db, start, end, gpu_hour_price=cm.gpu_hour_price,
                                         gpus=cm.gpus, window_s=cm.window_s, prices=acc.prices,
                                         hardware=cm.hardware, base_model=model)
        body = {**report.to_dict(), "currency": acc.prices.currency,
                "margin": None if report.margin is None else str(report.margin)}
        return JSONResponse(body)

    async def _known_tenant(self, tenant_id: str | None) -> str | None:
        """The tenant id, after a 404 for one that does not exist (a typo would be an empty report)."""
        if tenant_id is None:
            return None
        if not tenant_id:
            raise APIError(400, "`tenant` is empty: pass a tenant id (GET /admin/tenants lists them), or leave "
                                "it out for all tenants.", param="tenant")
        await run_in_threadpool(self.tenancy.service.get_tenant, tenant_id)
        return tenant_id


# -- query parameters --------------------------------------------------------------------------
def _query(request: Request, allowed: set[str]) -> dict[str, str]:
    q = request.query_params
    unknown = sorted(set(q.keys()) - allowed)
    if unknown:
        raise APIError(400, f"Unknown query parameter `{unknown[0]}` for {request.url.path}; valid: "
                            f"{', '.join(sorted(allowed))}.", param=unknown[0])
    return dict(q)


def _choice(q: dict[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = q.get(name, default)
    if value not in choices:
        raise APIError(400, f"`{name}` must be one of {', '.join(choices)} (got {value!r}); it defaults to {default}.",
                       param=name)
    return value


def _time(q: dict[str, str], name: str) -> datetime | None:
    if name not in q:
        return None
    try:
        return parse_time(q[name])
    except ValueError:
        raise APIError(400, f"`{name}` must be an ISO-8601 date or time, e.g. 2026-11-01 or 2026-11-01T00:00:00Z "
                            f"(UTC unless it has an offset; got {q[name]!r}).", param=name) from None


def _time_range(q: dict[str, str]) -> tuple[datetime, datetime]:
    """[start, end): end defaults to now, start to the first instant of the UTC month end falls in."""
    start, end = _time(q, "start"), _time(q, "end")
    if end is None:
        end = _now()
    if start is None:
        try:
            start, _ = month_bounds(end - timedelta(microseconds=1))
        except OverflowError:  # end=0001-01-01
            start = end
    if not start < end:
        what = "end" if "end" in q else "end (which defaults to now)"
        raise APIError(400, f"`start` ({start.isoformat()}) must be before {what} ({end.isoformat()}); the range "
                            "is [start, end).", param="start")
    return start, end


def _period(q: dict[str, str]) -> str:
    period = q.get("period")
    if not period:
        raise APIError(400, "`period` is required: the month as YYYY-MM (UTC), e.g. period=2026-11.", param="period")
    try:
        period_bounds(period)
    except ValueError:
        raise APIError(400, f"`period` must be a month as YYYY-MM, e.g. 2026-11 (got {period!r}).",
                       param="period") from None
    return period


def _csv(text: str, filename: str) -> Response:
    return Response(text, media_type=CSV, headers={"Content-Disposition": f'attachment; filename="{filename}"'})
