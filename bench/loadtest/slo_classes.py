"""Capacity per SLO class: the workload's tenants each in a class (`--tenant-classes`, cycled over
the tenants), each class's requests checked against its own targets (the config's `slo.classes`),
and each class's capacity the highest level at which its requests meet them, every lower level
meeting them too (stats.capacity's rule, per class).

The level is the whole workload's (all classes in flight together): a class's capacity is how much
of this mix the replicas carry before that class misses its promise, the tightest class first.
"""

from __future__ import annotations

from typing import Iterable

from bench.loadtest.stats import SLO, capacity, summarize


def tenant_classes(names: list[str], tenants: int) -> dict[int, str]:
    """Workload tenant index -> its class: `names` cycled over the tenants."""
    return {t: names[t % len(names)] for t in range(tenants)} if names else {}


def class_slos(app_args: dict, names: Iterable[str], max_error_rate: float) -> dict[str, SLO]:
    """Each named class's targets from the serve config's `slo:` (its classes, or the top-level
    figures as its one class); a name it does not have is refused."""
    from loraplex.observability.config import SloConfig

    classes = SloConfig(**(app_args.get("slo") or {})).resolved_classes()
    unknown = sorted(set(names) - set(classes))
    if unknown:
        raise SystemExit(f"loadtest: --tenant-classes names {', '.join(unknown)}: not a class of the config's "
                         f"slo: ({', '.join(classes)})")
    return {n: SLO(classes[n].ttft_p95_s, classes[n].tpot_p95_s, max_error_rate) for n in dict.fromkeys(names)}


def per_class(requests: list[dict], classes: dict[int, str], slos: dict[str, SLO], window_s: float) -> dict[str, dict]:
    """Each class's levels and capacity. `requests`: one {"level", "results"} per level swept (the
    per-request results of client.py, whose `tenant` is the workload's tenant index)."""
    out = {}
    for name, slo in slos.items():
        levels = [summarize([r for r in lv["results"] if classes.get(r["tenant"]) == name], lv["level"], window_s)
                  for lv in requests]
        cap = capacity(levels, slo)
        out[name] = {"ttft_p95_s": slo.ttft_p95_s, "tpot_p95_s": slo.tpot_p95_s,
                     "tenants": [t for t, c in classes.items() if c == name],
                     "capacity": cap["capacity"], "all_levels_met": cap["all_met"],
                     "met_above_first_miss": cap["met_above_first_miss"], "levels": levels}
    return out
