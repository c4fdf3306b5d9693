"""promtool unit tests of the generated rules: synthetic series that must fire each alert, with
the exact text it must carry, and some that must not. Generated with the rules (the thresholds
come from the same config): deploy/prometheus/rules.test.yml, run by `promtool test rules`.
"""
import math
import re


from loraplex.observability import names as n
from loraplex.observability.alert_text import expand
from loraplex.observability.promql import duration
from loraplex.observability.rules import BURN, CLASS_ALERT, COST_RECORD, render_yaml, rule_groups
from loraplex.observability.served import ServedPlatform

# Example label values: what a request or a refusal carries (must match names.py's regexes).
OK_STATUS, ERROR_STATUS = "ok", "error"
SHED_REASON, LIMIT_REASON = "503:shed", "429:rate_limit_requests"
assert re.fullmatch(n.ERROR_STATUSES, ERROR_STATUS) and not re.fullmatch(n.ERROR_STATUSES, OK_STATUS)
assert re.fullmatch(n.SHED_REASONS, SHED_REASON) and not re.fullmatch(n.SHED_REASONS, LIMIT_REASON)


def _sel(metric: str, **labels: str) -> str:
    return metric + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _series(metric: str, values: str, **labels: str) -> dict:
    return {"series": _sel(metric, **labels), "values": values}


class _Tests:
    def __init__(self, served: ServedPlatform):
        self.served, self.slo = served, served.config.slo
        self.annotations = {r["alert"]: r["annotations"] for g in rule_groups(served)["groups"]
                            for r in g["rules"] if "alert" in r}
        self.fire_at = self.slo.window_s + self.slo.for_s + 120   # seconds; every condition holds from 1 min
        self.points = self.fire_at // 60 + 2

    def ramp(self, per_min: float, points: int = 0) -> str:   # a counter growing per_min per 1-minute sample
        return f"0+{per_min:g}x{points or self.points}"

    def flat(self, value: float) -> str:
        return f"{value:g}x{self.points}"

    def alert(self, name: str, value: float, **labels: str) -> dict:
        return {"exp_labels": {**labels, "severity": self._severity(name)},
                "exp_annotations": {k: expand(v, value, labels) for k, v in self.annotations[name].items()}}

    def check(self, name: str, at_s: int, *alerts: dict) -> dict:
        return {"eval_time": duration(at_s), "alertname": name, "exp_alerts": list(alerts)}

    def _severity(self, name: str) -> str:
        return next(r["labels"]["severity"] for g in rule_groups(self.served)["groups"] for r in g["rules"]
                    if r.get("alert") == name)

    def case(self, name: str, series: list[dict], checks: list[dict], exprs: list[dict] = ()) -> dict:
        case = {"name": name, "interval": "1m", "input_series": series, "alert_rule_test": checks}
        if exprs:
            case["promql_expr_test"] = list(exprs)
        return case

    # -- cases --------------------------------------------------------------------------------
    def kv_cache(self) -> dict:
        hot = (1 + self.slo.kv_usage_alert) / 2
        checks = [self.check("LoraplexKVCacheNearlyFull", self.fire_at, self.alert("LoraplexKVCacheNearlyFull", hot, replica="r1"))]
        if self.slo.for_s >= 120:  # over the threshold, not yet for long enough: pending, not firing
            checks.insert(0, self.check("LoraplexKVCacheNearlyFull", self.slo.for_s - 60))
        return self.case("KV cache over the threshold fires after for_s; a cooler replica does not",
                         [_series(n.KV_USAGE, self.flat(hot), replica="r1"),
                          _series(n.KV_USAGE, self.flat(self.slo.kv_usage_alert / 2), replica="r2")], checks)

    def latency(self, alert: str, histogram: str, slo_s: float, slow: bool) -> dict:
        # Every request lands in one bucket: (slo, 3 slo] when slow, (0, slo / 2] when fast.
        les = [f"{slo_s:g}", f"{3 * slo_s:g}"] if slow else [f"{slo_s / 2:g}", f"{slo_s:g}"]
        counts = [0, 60] if slow else [60, 60]
        series = [_series(histogram + "_bucket", self.ramp(c), tenant="ten_a", le=le) for le, c in zip(les, counts)]
        series.append(_series(histogram + "_bucket", self.ramp(60), tenant="ten_a", le="+Inf"))
        p95 = float(les[0]) + (float(les[1]) - float(les[0])) * 0.95
        fired = [self.alert(alert, p95)] if slow else []
        return self.case(f"{alert}: {'slow' if slow else 'fast'} requests", series,
                         [self.check(alert, self.fire_at, *fired)])

    def _share(self, threshold: float) -> int:
        """Bad requests per 100 so the ratio is well over the threshold and the budget burn."""
        return min(100, max(20, math.ceil(200 * max(threshold, BURN * (1 - self.slo.availability)))))

    def errors(self) -> dict:
        bad = self._share(self.slo.error_rate)
        series = [_series(n.REQUESTS, self.ramp(100 - bad), tenant="ten_a", status=OK_STATUS),
                  _series(n.REQUESTS, self.ramp(bad), tenant="ten_a", status=ERROR_STATUS),
                  _series(n.REFUSALS, self.ramp(1000), tenant="ten_a", reason=LIMIT_REASON)]  # not ours: ignored
        return self.case("Errors over the threshold and burning the budget", series, [
            self.check("LoraplexErrorRateHigh", self.fire_at, self.alert("LoraplexErrorRateHigh", bad / 100)),
            self.check("LoraplexErrorBudgetBurn", self.fire_at, self.alert("LoraplexErrorBudgetBurn", bad / 100)),
            self.check("LoraplexShedRateHigh", self.fire_at)])

    def sheds(self) -> dict:
        shed = self._share(self.slo.shed_rate)
        series = [_series(n.REQUESTS, self.ramp(100 - shed), tenant="ten_a", status=OK_STATUS),
                  _series(n.REFUSALS, self.ramp(shed), tenant="ten_a", reason=SHED_REASON),
                  _series(n.REFUSALS, self.ramp(1000), tenant="ten_a", reason=LIMIT_REASON)]
        return self.case("503 sheds over the threshold count against availability, 429s do not", series, [
            self.check("LoraplexShedRateHigh", self.fire_at, self.alert("LoraplexShedRateHigh", shed / 100)),
            self.check("LoraplexErrorBudgetBurn", self.fire_at, self.alert("LoraplexErrorBudgetBurn", shed / 100)),
            self.check("LoraplexErrorRateHigh", self.fire_at)])

    def replicas(self) -> dict:
        app, (first, *rest) = self.served.application, list(self.served.deployments().items())
        series = [_series(n.SERVE_REPLICA_HEALTHY, self.flat(first[1] - 1), application=app, deployment=first[0])]
        series += [_series(n.SERVE_REPLICA_HEALTHY, self.flat(want), application=app, deployment=d) for d, want in rest]
        series += [_series("up", self.flat(0), job=n.RAY_JOB, instance="10.0.0.2:8080"),
                   _series("up", self.flat(1), job=n.RAY_JOB, instance="10.0.0.1:8080")]
        return self.case(f"One {first[0]} replica short, one Ray node's metrics unreachable", series, [
            self.check("LoraplexReplicaDown", self.fire_at,
                       self.alert("LoraplexReplicaDown", first[1] - 1, application=app, deployment=first[0])),
            self.check("LoraplexScrapeTargetDown", self.fire_at,
                       self.alert("LoraplexScrapeTargetDown", 0, instance="10.0.0.2:8080", job=n.RAY_JOB))])

    def spool(self) -> dict:
        stuck = (self.slo.spool_flush_max_age_s // 60 + 2) * 60   # first sample with age > the limit
        points = stuck // 60 + 3
        series = [_series(n.SPOOL_LAST_FLUSH, f"0 60x{points}", replica="r1"),   # last flushed at t = 1 min
                  _series(n.SPOOL_LAST_FLUSH, f"0+60x{points}", replica="r2")]   # flushes all along
        name = "LoraplexUsageSpoolNotFlushing"
        return self.case("A spool not flushed for longer than the limit (for 1 min)", series, [
            self.check(name, stuck),  # over the limit: pending for a minute
            self.check(name, stuck + 60, self.alert(name, stuck, replica="r1"))])

    def database(self) -> dict:
        points = 8
        series = [_series(n.DATABASE_REACHABLE, f"1 1 0x{points}", replica="r1"),   # down from t = 2 min
                  _series(n.DATABASE_REACHABLE, f"1x{points + 2}", replica="r2"),
                  _series(n.SPOOL_LAST_FLUSH, f"0+60x{points + 2}", replica="r1")]
        name = "LoraplexDatabaseUnreachable"
        return self.case("An ingress replica that cannot reach the database (for 1 min); a blip does not fire",
                         series, [self.check(name, 120),  # down: pending for a minute
                                  self.check(name, 180, self.alert(name, 0, replica="r1"))])

    def budget_source(self) -> dict:
        name = "LoraplexBudgetSourceFailing"
        series = [_series(n.BUDGET_SOURCE_FAILURES, "0 0 0 0 0 0 0+3x5")]   # 3 failed reads a minute from 6 min
        return self.case("The limiter's budget reads failing; none before", series, [
            self.check(name, 300),
            self.check(name, 660, self.alert(name, 15))])

    def adapter_store(self) -> dict:
        name = "LoraplexAdapterStoreFailing"
        series = [_series(n.ADAPTER_STORE_FAILURES, "0 0 0 0 0 0 0+2x5", operation="read"),   # 2 a minute from 6 min
                  _series(n.ADAPTER_STORE_FAILURES, "0x12", operation="write")]
        return self.case("Adapter store calls failing (reads only); none before", series, [
            self.check(name, 300),
            self.check(name, 660, self.alert(name, 10, operation="read"))])

    def disk(self, name: str, disk: str) -> dict:
        series = [_series(n.DISK_WRITE_FAILURES, "0 0 0 0 0 0 0+3x5", replica="r1", disk=disk),  # 3 a minute from 6 min
                  _series(n.DISK_WRITE_FAILURES, "0x12", replica="r2", disk=disk),
                  *[_series(n.DISK_WRITE_FAILURES, "0+5x12", replica="r3", disk=other)  # another disk's: not this alert
                    for other in ("usage_spool", "adapter_cache", "upload_temp") if other != disk]]
        return self.case(f"{name}: writes to {disk} failing on one replica; none before", series, [
            self.check(name, 300),
            self.check(name, 660, self.alert(name, 15, replica="r1"))])

    def slo_class(self) -> dict:
        """The first class with a target misses a fifth of its requests; another class misses none."""
        targeted = [k for k, c in self.slo.resolved_classes().items() if c.ttft_p95_s or c.tpot_p95_s]
        name, missed = targeted[0], 20
        series = [_series(n.SLO_REQUESTS, self.ramp(100 - missed), tenant="ten_a", slo_class=name, met="true"),
                  _series(n.SLO_REQUESTS, self.ramp(missed), tenant="ten_a", slo_class=name, met="false")]
        series += [_series(n.SLO_REQUESTS, self.ramp(100), tenant="ten_b", slo_class=k, met="true") for k in targeted[1:]]
        return self.case(f"The {name} class misses its targets for a fifth of its requests; the others none", series,
                         [self.check(CLASS_ALERT, self.fire_at, self.alert(CLASS_ALERT, missed / 100, slo_class=name))])

    def cost(self) -> dict:
        pricing = self.served.config.accounting.pricing
        tenants = {"ten_default": pricing.plans[pricing.default_plan], **pricing.tenant_overrides}
        # With per-base prices, traffic on every priced base and on one priced as the plan.
        models = [*sorted(pricing.priced_models()), "unpriced-base"] if pricing.priced_models() else ["base"]
        series, samples = [], []
        for tenant, plan_price in tenants.items():  # per second and base: 10 prompt tokens (1 cached), 2 completion
            cost = 0.0
            for model in models:
                labels = {"tenant": tenant, "adapter": "", n.MODEL: model}
                series += [_series(n.PROMPT_TOKENS, self.ramp(600, 12), **labels),   # to 12 min:
                           _series(n.CACHED_PROMPT_TOKENS, self.ramp(60, 12), **labels),  # the rule's
                           _series(n.COMPLETION_TOKENS, self.ramp(120, 12), **labels)]    # 5m at 10m
                # The recording rule's float arithmetic (promtool compares floats), not the ledger's money.
                price = plan_price.for_model(model)
                cost += (9 * float(price.input) + float(price.cached_input) + 2 * float(price.output)) / 1e6
            samples.append({"labels": _sel(COST_RECORD, currency=pricing.currency, tenant=tenant), "value": cost})
        return self.case("Cost per second at list prices (overrides win, each base at its price)", series, [],
                         [{"expr": COST_RECORD, "eval_time": "10m", "exp_samples": samples}])


def rule_tests(served: ServedPlatform) -> dict:
    t, slo = _Tests(served), served.config.slo
    return {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [
        t.kv_cache(),
        t.latency("LoraplexTTFTOverSLO", n.TTFT, slo.ttft_p95_s, slow=True),
        t.latency("LoraplexTTFTOverSLO", n.TTFT, slo.ttft_p95_s, slow=False),
        t.latency("LoraplexTPOTOverSLO", n.TPOT, slo.tpot_p95_s, slow=True),
        t.latency("LoraplexTPOTOverSLO", n.TPOT, slo.tpot_p95_s, slow=False),
        t.errors(), t.sheds(), t.replicas(), t.spool(), t.database(), t.budget_source(), t.adapter_store(),
        t.disk("LoraplexUsageSpoolWriteFailing", "usage_spool"), t.disk("LoraplexAdapterCacheDiskFull", "adapter_cache"),
        t.disk("LoraplexUploadTempDiskFull", "upload_temp"), t.slo_class(), t.cost()]}


def render_rule_tests(served: ServedPlatform) -> str:
    return render_yaml(rule_tests(served))

