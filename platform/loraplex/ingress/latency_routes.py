"""GET /admin/latency: TTFT / TPOT P95 over the last window against the SLO (the console's
latency panel; `curl` and the CLI read the same JSON).

From `console.prometheus_url` when one is configured and answers, else from the usage ledger's
timestamps; `source` says which, and `prometheus_error` why Prometheus was not used. `classes`:
each SLO class's targets and, from Prometheus only (the ledger does not keep a request's class),
its attainment, per tenant too, and its goodput."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from loraplex.accounting.latency import ledger_latency
from loraplex.console.config import ConsoleConfig
from loraplex.ingress.auth import check_admin
from loraplex.ingress.errors import APIError
from loraplex.observability.prometheus_latency import PrometheusUnavailable, prometheus_latency
from loraplex.observability.config import SloConfig
from loraplex.tenancy.tenancy import Tenancy

DEFAULT_WINDOW_S = 3600
MAX_WINDOW_S = 7 * 86400


class LatencyRoutes:
    def __init__(self, tenancy: Tenancy, db, slo: SloConfig, console: ConsoleConfig):
        self.tenancy, self.db, self.slo, self.console = tenancy, db, slo, console

    def routes(self) -> list[Route]:
        return [Route("/admin/latency", self.latency, methods=["GET"])]

    async def latency(self, request: Request) -> Response:
        check_admin(request, self.tenancy)
        window_s = _window(request)
        body = {"window_s": window_s, "slo": {"ttft_p95_s": self.slo.ttft_p95_s, "tpot_p95_s": self.slo.tpot_p95_s},
                "source": "ledger", "requests": None, "prometheus_error": None}
        figures, measured = None, {}
        if self.console.prometheus_url:
            try:
                p = await prometheus_latency(self.console.prometheus_url, window_s, self.console.prometheus_timeout_s)
                figures = {"source": "prometheus", "ttft_p95_s": p.ttft_p95_s, "tpot_p95_s": p.tpot_p95_s}
                measured = p.classes or {}
            except PrometheusUnavailable as exc:
                body["prometheus_error"] = str(exc)
        if figures is None:
            end = datetime.now(timezone.utc)
            led = await run_in_threadpool(ledger_latency, self.db, end - timedelta(seconds=window_s), end)
            figures = {"source": "ledger", "requests": led.requests,
                       "ttft_p95_s": led.ttft_p95_s, "tpot_p95_s": led.tpot_p95_s}
        body.update(figures)
        body["within_slo"] = {k: None if body[f"{k}_p95_s"] is None else body[f"{k}_p95_s"] <= body["slo"][f"{k}_p95_s"]
                              for k in ("ttft", "tpot")}
        body["classes"] = {name: {"ttft_p95_s": c.ttft_p95_s, "tpot_p95_s": c.tpot_p95_s, "availability": c.availability,
                                  "attainment": measured.get(name, {}).get("attainment"),
                                  "goodput_tokens_per_s": measured.get(name, {}).get("goodput_tokens_per_s"),
                                  "tenants": measured.get(name, {}).get("tenants", {})}
                           for name, c in self.slo.resolved_classes().items()}
        body["goodput_tokens_per_s"] = (sum(m.get("goodput_tokens_per_s") or 0.0 for m in measured.values())
                                        if measured else None)
        return JSONResponse(body)


def _window(request: Request) -> int:
    unknown = sorted(set(request.query_params) - {"window_s"})
    if unknown:
        raise APIError(400, f"Unknown query parameter `{unknown[0]}` for /admin/latency; valid: window_s.",
                       param=unknown[0])
    raw = request.query_params.get("window_s", str(DEFAULT_WINDOW_S))
    try:
        window_s = int(raw)
    except ValueError:
        window_s = 0
    if not 60 <= window_s <= MAX_WINDOW_S:
        raise APIError(400, f"`window_s` must be whole seconds from 60 to {MAX_WINDOW_S} (got {raw!r}); it "
                            f"defaults to {DEFAULT_WINDOW_S} (the last hour).", param="window_s")
    return window_s
