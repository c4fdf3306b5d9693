"""Every PromQL expression LoRAPlex ships, built from names.py: the alert rules (rules.py), the
recording rules and the dashboard (dashboard_panels.py) all take theirs from here.

`window` is a PromQL duration: a fixed one in rules ("5m"), Grafana's `$__rate_interval` or
`$__range` in panels.
"""
from decimal import Decimal
from typing import Callable, Iterable

from loraplex.accounting.config import PricingConfig, TokenPrice
from loraplex.observability import names as n


def duration(seconds: float) -> str:
    """Seconds as a PromQL duration: 300 -> 5m, 90 -> 90s."""
    s = int(seconds)
    if s != seconds or s < 0:
        raise ValueError(f"durations are whole seconds, got {seconds}")
    for unit, size in (("h", 3600), ("m", 60)):
        if s and s % size == 0:
            return f"{s // size}{unit}"
    return f"{s}s"


def _by(labels: Iterable[str]) -> str:
    labels = list(labels)
    return f" by ({', '.join(labels)})" if labels else ""


def per_second(counter: str, window: str, by: Iterable[str] = (), match: str = "") -> str:
    """Events per second summed over series (by `by`), e.g. tokens/s."""
    sel = f"{counter}{{{match}}}" if match else counter
    return f"sum{_by(by)} (rate({sel}[{window}]))"


def increase(counter: str, window: str, by: Iterable[str] = (), match: str = "") -> str:
    sel = f"{counter}{{{match}}}" if match else counter
    return f"sum{_by(by)} (increase({sel}[{window}]))"


def quantile(q: float, histogram: str, window: str, by: Iterable[str] = ()) -> str:
    """The q-quantile of a histogram over all its series (or per `by`), never a mean."""
    return f"histogram_quantile({q}, sum{_by(['le', *by])} (rate({histogram}_bucket[{window}])))"


def _requests(window: str) -> str:
    return f"({per_second(n.REQUESTS, window)} or vector(0))"


def _failed(window: str) -> str:
    return f"({per_second(n.REQUESTS, window, match=f'{n.STATUS}=~{_q(n.ERROR_STATUSES)}')} or vector(0))"


def _shed(window: str) -> str:
    return f"({per_second(n.REFUSALS, window, match=f'{n.REASON}=~{_q(n.SHED_REASONS)}')} or vector(0))"


def error_ratio(window: str) -> str:
    """Share of requests that reached an engine and failed us (error, engine lost, timeout)."""
    return f"{_failed(window)} / {_requests(window)}"


def shed_ratio(window: str) -> str:
    """Share of requests refused with 503 (shed, queue full, limiter down) among those not
    refused for the caller's own reasons (auth, unknown model, tenant limits)."""
    return f"{_shed(window)} / ({_requests(window)} + {_shed(window)})"


def unavailability(window: str) -> str:
    """Share of requests failed or refused with 503 (shed, or a store or disk of ours failing; uploads'
    503s included): what the availability objective counts against. A tenant's own 4xx is not.
    With no traffic it is 0 / 0 (no value): nothing fires and nothing is plotted."""
    return f"({_failed(window)} + {_shed(window)}) / ({_requests(window)} + {_shed(window)})"


def availability(window: str) -> str:
    return f"1 - {unavailability(window)}"


def prefix_hit_ratio(window: str, by: Iterable[str] = ()) -> str:
    """Share of looked-up prompt tokens found in the prefix cache."""
    return f"{per_second(n.PREFIX_HITS, window, by)} / {per_second(n.PREFIX_QUERIES, window, by)}"


def per_replica(gauge: str) -> str:
    return f"max by ({n.REPLICA}) ({gauge})"


def spool_age() -> str:
    """Seconds since each replica last copied its usage spool into the database."""
    return f"time() - {per_replica(n.SPOOL_LAST_FLUSH)}"


def database_unreachable() -> str:
    """Ingress replicas whose last query could not reach the database (value 0)."""
    return f"min by ({n.REPLICA}) ({n.DATABASE_REACHABLE}) == 0"


def budget_source_failures(window: str) -> str:
    """Failed month-to-date usage reads of the limiter actors over the window."""
    return f"sum (increase({n.BUDGET_SOURCE_FAILURES}[{window}])) > 0"


def adapter_store_failures(window: str) -> str:
    """Failed or timed-out adapter store calls over the window, by operation."""
    return f"sum by ({n.OPERATION}) (increase({n.ADAPTER_STORE_FAILURES}[{window}])) > 0"


def disk_write_failures(disk: str, window: str) -> str:
    """Failed writes to one node-local disk over the window, per replica."""
    return f'sum by ({n.REPLICA}) (increase({n.DISK_WRITE_FAILURES}{{disk="{disk}"}}[{window}])) > 0'


def healthy_replicas(application: str, deployment: str) -> str:
    """Ray Serve's count of healthy replicas of one deployment (per-replica 0/1 series or one
    per-deployment count, depending on Serve's settings: their sum is the count either way)."""
    match = f'application="{application}", deployment="{deployment}"'
    return f"sum by (application, deployment) ({n.SERVE_REPLICA_HEALTHY}{{{match}}})"


def targets_down() -> str:
    return f'up{{job=~"{n.RAY_JOB}|{n.STATIC_JOB}"}} == 0'


def constant(value: float) -> str:
    """A flat line (an SLO or a threshold) in a panel."""
    return f"vector({value:g})"


def tenant_cost(pricing: PricingConfig, delta: Callable[..., str]) -> str:
    """Money per tenant at the configured list prices: the default plan's, or a tenant's
    override, each base model at its own where the price names it (`models`). `delta` is
    `per_second` (cost rate) or `increase` (cost over a range) with its window bound
    (functools.partial). Plans set per tenant in the database are not visible here: a tenant on
    another plan is shown at the default plan's price; the bill is the statement."""
    plan, overrides = pricing.plans[pricing.default_plan], pricing.tenant_overrides
    if not pricing.priced_models():  # one price per tenant for every base: no need to split by model
        parts = [_cost(overrides[t], delta, f'{n.TENANT}="{t}"', [n.TENANT]) for t in sorted(overrides)]
        return " or ".join([*parts, _cost(plan, delta, "", [n.TENANT])])
    # Per (tenant, model), most specific first: `or` keeps the left side's series where both have one.
    by = [n.TENANT, n.MODEL]
    parts = [_cost(overrides[t].for_model(m), delta, f'{n.TENANT}="{t}", {n.MODEL}="{m}"', by)
             for t in sorted(overrides) for m in sorted(overrides[t].models)]
    parts += [_cost(overrides[t], delta, f'{n.TENANT}="{t}"', by) for t in sorted(overrides)]
    parts += [_cost(plan.for_model(m), delta, f'{n.MODEL}="{m}"', by) for m in sorted(plan.models)]
    parts.append(_cost(plan, delta, "", by))
    return f"sum by ({n.TENANT}) ({' or '.join(parts)})"


def _cost(price: TokenPrice, delta: Callable[..., str], match: str, by: list[str]) -> str:
    prompt = delta(n.PROMPT_TOKENS, by=by, match=match)
    cached = _or_zero(delta(n.CACHED_PROMPT_TOKENS, by=by, match=match), prompt)
    completion = _or_zero(delta(n.COMPLETION_TOKENS, by=by, match=match), prompt)
    return (f"(({prompt} - {cached}) * {_num(price.input)} + {cached} * {_num(price.cached_input)}"
            f" + {completion} * {_num(price.output)}) / 1e6")


def _or_zero(expr: str, like: str) -> str:
    """expr, or 0 for the series of `like` it lacks (a tenant with no cached tokens yet)."""
    return f"({expr} or {like} * 0)"


def _num(d: Decimal) -> str:
    return format(d.normalize(), "f")


def _q(regex: str) -> str:
    return f'"{regex}"'
