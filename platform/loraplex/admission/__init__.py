"""Admission control: tenant limits (requests/tokens per minute, concurrency, monthly budget).

core.py (the pure shared state: buckets, slots, budgets, Retry-After), limiter.py (the ingress
side: leases, admit/release, LimitExceeded), actor.py + ray_backend.py (the state in a Ray actor
per shard), budget_source.py (the ledger's month-to-date), config.py (LimiterConfig).
"""
