"""The gate: a tenant's adapter, or its plan's traffic, moves to another base only after a passing
quality run on its own data (or an operator's recorded override).

A move needs a run when an adapter version is bound to a base other than the one it was trained
on (its adapter_config.json's base_model_name_or_path), or when a plan's traffic moves to a
cheaper base. The run that clears it compares, for that tenant: the adapter (or the base the
traffic is on) as reference, and the same adapter on the new base (or the new base) as candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from loraplex.errors import StatusError


@dataclass(frozen=True)
class Move:
    tenant: str
    adapter: Optional[str]  # the adapter's name; None: the tenant's base-model traffic (its plan)
    from_base: str  # the base the adapter was trained on, or the plan's traffic is on now
    to_base: str

    @property
    def reference(self) -> str:
        """The `reference` model of the run that clears this move, as the tenant names it."""
        return self.adapter or self.from_base

    @property
    def candidate(self) -> str:
        return f"{self.to_base}:{self.adapter}" if self.adapter else self.to_base


@dataclass(frozen=True)
class RunRecord:
    """What the gate reads of a finished quality run."""

    id: str
    tenant: str
    reference_base: str
    reference_adapter: Optional[str]
    candidate_base: str
    candidate_adapter: Optional[str]
    passed: bool
    summary: str = ""  # the verdict's words (a failed run's failures)

    def clears(self, move: Move) -> bool:
        return (self.tenant == move.tenant and self.reference_base == move.from_base
                and self.candidate_base == move.to_base and self.reference_adapter == move.adapter
                and self.candidate_adapter == move.adapter)


@dataclass(frozen=True)
class Override:
    """An operator's recorded decision to let a move through without a passing run."""

    tenant: str
    adapter: Optional[str]
    to_base: str
    reason: str

    def clears(self, move: Move) -> bool:
        return self.tenant == move.tenant and self.adapter == move.adapter and self.to_base == move.to_base


class QualityRunRequired(StatusError):
    """The move needs a passing quality run on record (409)."""

    status = 409


def needs_run(move: Move, cheaper: Callable[[str, str], bool]) -> bool:
    """An adapter moving to any base but its own; a plan's traffic moving to a cheaper base
    (`cheaper(to, from)`)."""
    if move.to_base == move.from_base:
        return False
    return move.adapter is not None or cheaper(move.to_base, move.from_base)


def check(move: Move, runs: Iterable[RunRecord], overrides: Iterable[Override],
          cheaper: Callable[[str, str], bool] = lambda to, frm: True) -> None:
    """Raise QualityRunRequired naming the run to do (and the last run's failures, if one failed)
    unless the move needs no run, or a passing run or an override is on record. `runs`: finished
    runs of the tenant, newest first."""
    if not needs_run(move, cheaper):
        return
    if any(o.clears(move) for o in overrides):
        return
    matching = [r for r in runs if r.clears(move)]
    if any(r.passed for r in matching):
        return
    what = f"the adapter `{move.adapter}` (trained on {move.from_base})" if move.adapter \
        else f"your traffic on {move.from_base}"
    last = f" The last run, {matching[0].id}, did not pass: {matching[0].summary}." if matching else ""
    raise QualityRunRequired(
        f"Moving {what} to the base {move.to_base} needs a passing quality run on your own requests first: "
        f"`loraplex quality run FILE.jsonl --reference {move.reference} --candidate {move.candidate}` "
        f"(POST /v1/quality/runs with reference {move.reference!r}, candidate {move.candidate!r}).{last} "
        "An operator may record an override instead (POST /admin/quality/overrides).",
        code="quality_run_required", param="base_model")


def price_cheaper(price_of: Callable[[str], float]) -> Callable[[str, str], bool]:
    """`cheaper(to, from)` from a base's price per token under the tenant's plan."""
    return lambda to, frm: price_of(to) < price_of(frm)
