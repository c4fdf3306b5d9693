"""TTFT / TPOT P95 over a window, asked of a Prometheus HTTP API (`/api/v1/query`): the figures
the alert rules judge, from the same PromQL (promql.quantile over the `loraplex_*` histograms);
and per SLO class, its attainment (share of requests within its targets), per tenant too, and its
goodput (tokens/s of those requests)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import httpx

from loraplex.observability import names as n
from loraplex.observability.promql import duration, goodput, per_second, quantile


class PrometheusUnavailable(Exception):
    """Prometheus did not answer, or answered something that is not a query result."""


@dataclass
class PrometheusLatency:
    ttft_p95_s: Optional[float]  # None: no request in the window (the quantile has no value)
    tpot_p95_s: Optional[float]
    # Per SLO class: {"attainment", "goodput_tokens_per_s", "tenants": {tenant: attainment}}.
    classes: Optional[dict] = None


def class_queries(window_s: int) -> dict[str, str]:
    """Attainment per class and per (tenant, class), goodput per class: vectors by label."""
    w = duration(window_s)

    def attained(by: tuple[str, ...]) -> str:
        every, met = per_second(n.SLO_REQUESTS, w, by), per_second(n.SLO_REQUESTS, w, by, match=n.MET + '="true"')
        return f"({met} or {every} * 0) / {every}"
    return {"attainment": attained((n.SLO_CLASS,)), "tenants": attained(("tenant", n.SLO_CLASS)),
            "goodput_tokens_per_s": goodput(w, (n.SLO_CLASS,))}


def latency_queries(window_s: int, q: float = 0.95) -> dict[str, str]:
    window = duration(window_s)
    return {"ttft_p95_s": quantile(q, n.TTFT, window), "tpot_p95_s": quantile(q, n.TPOT, window)}


async def prometheus_latency(base_url: str, window_s: int, timeout_s: float, q: float = 0.95,
                             transport: httpx.AsyncBaseTransport | None = None) -> PrometheusLatency:
    values: dict[str, Optional[float]] = {}
    async with httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout_s, transport=transport) as client:
        for field, promql in latency_queries(window_s, q).items():
            values[field] = _scalar(await _query(client, base_url, promql))
        classes: dict[str, dict] = {}
        for field, promql in class_queries(window_s).items():
            for labels, value in _vector(await _query(client, base_url, promql)):
                entry = classes.setdefault(labels.get(n.SLO_CLASS, "-"), {"tenants": {}})
                if field == "tenants":
                    entry["tenants"][labels.get("tenant", "-")] = value
                else:
                    entry[field] = value
    return PrometheusLatency(**values, classes=classes)


async def _query(client: httpx.AsyncClient, base_url: str, promql: str) -> dict:
    try:
        response = await client.get("/api/v1/query", params={"query": promql})
        body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise PrometheusUnavailable(f"{base_url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code != 200 or body.get("status") != "success":
        raise PrometheusUnavailable(f"{base_url} answered {response.status_code}: "
                                    f"{body.get('error') or response.text[:200]}")
    return body


def _vector(body: dict) -> list[tuple[dict, float]]:
    """Every (labels, value) of an instant-vector answer, NaN and infinities left out."""
    out = []
    for sample in body.get("data", {}).get("result") or []:
        value = float(sample["value"][1])
        if not (math.isnan(value) or math.isinf(value)):
            out.append((sample.get("metric", {}), value))
    return out


def _scalar(body: dict) -> Optional[float]:
    """The one sample of an instant-vector answer; None when empty or NaN (no requests)."""
    result = body.get("data", {}).get("result") or []
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) or math.isinf(value) else value
