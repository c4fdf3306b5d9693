"""PlatformConfig: everything `serve_config.yaml`'s `args:` can set, validated in one place.

Each package keeps its own settings in its config.py; this module composes them, lists the base
models and holds the validators that read more than one package's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from loraplex.accounting.config import DEFAULT_PLAN, AccountingConfig
from loraplex.batches.config import BatchConfig
from loraplex.console.config import ConsoleConfig
from loraplex.dedicated.config import DedicatedConfig
from loraplex.engine.config import EngineConfig, EngineDeploymentConfig
from loraplex.ingress.config import IngressDeploymentConfig
from loraplex.metrics.config import MetricsConfig
from loraplex.observability.config import SloConfig
from loraplex.quality.config import QualityConfig
from loraplex.registry.config import RegistryConfig
from loraplex.tenancy.config import TenancyConfig


DEFAULT_POOL = "Engine"  # the first base's Engine deployment: the name single-model configs always had


def _none_as_empty(cls, value: Any) -> Any:
    """An `engine:` key left empty in YAML (None) means every default, as if it were left out."""
    return {} if value is None else value


def _unserved(names, bases: list[str]) -> list[str]:
    """`names` (in their order) that are none of the app's bases: a setting for a base that is not
    served would never apply, so the validators below refuse it."""
    return [name for name in names if name not in bases]


class BaseModelConfig(BaseModel):
    """One base model and its own pool of Engine replicas (docs/operations.md, "Several base models")."""

    model_config = ConfigDict(extra="forbid")

    name: Optional[str] = Field(
        None,
        description="The base's unique name, which clients send as `model` (default: engine.served_model_name, "
        "else the model dir's name).")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="vLLM settings of this base's replicas.")
    engine_deployment: EngineDeploymentConfig = Field(
        default_factory=EngineDeploymentConfig,
        description="This base's Engine pool: replicas or autoscaling, resources, fair queue, routing, shedding.")

    _allow_none = field_validator("engine", mode="before")(classmethod(_none_as_empty))

    @model_validator(mode="after")
    def _name_is_the_served_name(self) -> "BaseModelConfig":
        served = self.engine.served_model_name
        if self.name is not None and served is not None and served != self.name:
            raise ValueError(f"name {self.name!r} and engine.served_model_name {served!r} differ: clients send one "
                             "name for a base; set only `name`")
        if self.name is not None:
            self.engine = self.engine.model_copy(update={"served_model_name": self.name})
        return self

    @property
    def model_id(self) -> str:
        """The base's name: what clients send, what usage records and prices say."""
        return self.engine.model_id


class PlatformConfig(BaseModel):
    """The `args:` block of serve_config.yaml."""

    model_config = ConfigDict(extra="forbid")

    database_url: str = Field(
        "sqlite:///var/loraplex.db",
        repr=False,
        description="SQLAlchemy URL of tenants, adapters and usage: a SQLite file (single node) or "
        "postgresql://... (multi-node), kept out of repr().")
    registry: RegistryConfig = Field(
        default_factory=RegistryConfig, description="The adapter store, its node-local cache and the upload bounds.")
    tenancy: TenancyConfig = Field(
        default_factory=TenancyConfig, description="The admin token, the plans' limits and the API-key cache.")
    accounting: AccountingConfig = Field(
        default_factory=AccountingConfig, description="Usage ledger, prices, billing export and cost model.")
    slo: SloConfig = Field(
        default_factory=SloConfig, description="Service-level objectives: the alert rules' and dashboard's "
        "thresholds, GET /admin/latency's targets and the TPOT target replicas size batches and steps by.")

    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="The one base model's vLLM settings (single-model form; left out with `models:`).")
    engine_deployment: EngineDeploymentConfig = Field(
        default_factory=EngineDeploymentConfig,
        description="The one base model's Engine pool (single-model form; left out with `models:`).")
    models: list[BaseModelConfig] = Field(
        default_factory=list,
        description="Several base models in one app, each with its own Engine pool (`Engine` for the first, "
        "`Engine-<name>` for the others); left out: the one base of `engine` / `engine_deployment`.")
    ingress: IngressDeploymentConfig = Field(
        default_factory=IngressDeploymentConfig, description="The Ingress replicas and the bounds of a request.")
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig, description="Per-tenant Prometheus metrics from every replica, exported "
        "through Ray's metrics agent (docs/metrics.md).")
    console: ConsoleConfig = Field(
        default_factory=ConsoleConfig, description="Where the web console's latency panel reads TTFT/TPOT.")
    batches: BatchConfig = Field(
        default_factory=BatchConfig, description="The Batch API (/v1/files, /v1/batches): bounds, completion "
        "window and the pace of its runner.")
    quality: QualityConfig = Field(
        default_factory=QualityConfig, description="Quality runs of a cheaper base on a tenant's own requests, "
        "their thresholds, and the gate on an adapter's move to another base.")
    dedicated: DedicatedConfig = Field(
        default_factory=DedicatedConfig, description="Hot adapter versions served merged into the base weights "
        "on their own Engine deployments, falling back to the LoRA pool.")

    _allow_none = field_validator("engine", mode="before")(classmethod(_none_as_empty))

    @model_validator(mode="after")
    def _one_list_of_bases(self) -> "PlatformConfig":
        """`models:` or the single-model `engine` / `engine_deployment`, never both (one would be
        ignored); afterwards `models` always lists every base and `engine` / `engine_deployment` are
        the first's (what code that serves one base reads)."""
        if not self.models:
            self.models = [BaseModelConfig(engine=self.engine, engine_deployment=self.engine_deployment)]
            return self
        both = sorted({"engine", "engine_deployment"} & self.model_fields_set)
        first = self.models[0]
        if both and (self.engine, self.engine_deployment) != (first.engine, first.engine_deployment):  # a dump's are equal
            raise ValueError(f"{' and '.join(both)} set beside `models:`: with several bases each entry of `models` "
                             f"has its own; move {both[0]} into the entry of its base")
        seen: dict[str, int] = {}
        for i, base in enumerate(self.models):
            if base.model_id in seen:
                raise ValueError(f"models[{i}] and models[{seen[base.model_id]}] are both named {base.model_id!r}: "
                                 "each base needs its own name (set models[i].name)")
            seen[base.model_id] = i
            pool = pool_deployment_name(i, base.model_id)
            if "#" in pool:
                raise ValueError(f"models[{i}].name {base.model_id!r}: a base's name may not contain '#' "
                                 "(Ray Serve deployment names cannot)")
        self.engine, self.engine_deployment = self.models[0].engine, self.models[0].engine_deployment
        return self

    @model_validator(mode="after")
    def _prices_name_served_bases(self) -> "PlatformConfig":
        """A per-base price for a base this app does not serve would be stored and never charged
        (a misspelt id bills at the plan's prices): refuse it, naming the bases."""
        for where, names, fix in (
                ("accounting.pricing prices base model(s)", self.accounting.pricing.priced_models(),
                 ": fix the name under `models:` of the plan or override"),
                ("accounting.cost_model.models names", self.accounting.cost_model.models, "")):
            if unknown := _unserved(sorted(set(names)), self.base_names):
                raise ValueError(f"{where} {', '.join(unknown)}, which this app does not serve (its bases: "
                                 f"{', '.join(self.base_names)}){fix}")
        return self

    @model_validator(mode="after")
    def _plan_limits_name_known_bases(self) -> "PlatformConfig":
        """A plan's per-base limits on a base that is not served would never apply: a typo or a
        base removed from `models:` is refused at start, not silently unlimited."""
        bases = self.base_names
        for plan, plan_config in self.tenancy.plans.items():
            if unknown := _unserved(plan_config.limits.models or {}, bases):
                raise ValueError(f"tenancy.plans.{plan}.limits.models: unknown base model {unknown[0]!r}; the bases "
                                 f"are {', '.join(bases)}. Name one of them (a base's `name`, else its "
                                 "model dir's name) or remove the entry")
        return self

    @model_validator(mode="after")
    def _plan_classes_known(self) -> "PlatformConfig":
        """A plan naming an SLO class that is not configured would be served as the default class."""
        classes = self.slo.resolved_classes()
        for plan, plan_config in self.tenancy.plans.items():
            name = plan_config.limits.slo_class
            if name is not None and name not in classes:
                raise ValueError(f"tenancy.plans.{plan}.limits.slo_class: unknown class {name!r}; slo.classes "
                                 f"are {', '.join(classes)}")
        return self

    @model_validator(mode="after")
    def _shedding_reachable(self) -> "PlatformConfig":
        """With the fair queue on, vLLM holds at most max_num_seqs of a replica's requests: a
        priority-0 count threshold set at or above it would be stored and never act."""
        for i, base in enumerate(self.models):
            shedding, seqs = base.engine_deployment.shedding, base.engine.max_num_seqs
            where = "engine_deployment" if len(self.models) == 1 else f"models[{i}].engine_deployment"
            if (base.engine_deployment.fair_queue.enabled and "shed_requests" in shedding.model_fields_set
                    and shedding.requests_by_priority is None and shedding.shed_requests >= seqs):
                raise ValueError(
                    f"{where}.shedding.shed_requests={shedding.shed_requests} can never be reached: with "
                    f"fair_queue on, vLLM holds at most max_num_seqs={seqs} of a replica's requests and the queue "
                    "holds the rest. Set it below max_num_seqs to refuse priority 0 before the batch is full, or "
                    f"bound the queue with {where}.fair_queue.max_queued instead.")
        return self

    @model_validator(mode="after")
    def _cost_model_follows_the_profile(self) -> "PlatformConfig":
        """An unset cost model prices the hardware the Engine replicas run on: a GPU's hour where they
        have GPUs, a CPU VM's otherwise (a CPU install priced at a GPU's hour reports a cost per
        token thousands of times too high)."""
        on_gpu = any(base.engine_deployment.num_gpus > 0 for base in self.models)
        cost_model = self.accounting.cost_model.for_profile(on_gpu=on_gpu)
        if cost_model is not self.accounting.cost_model:
            self.accounting = self.accounting.model_copy(update={"cost_model": cost_model})
        return self

    def plan_names(self) -> set[str]:
        """The plans a tenant may be put on: those with limits (tenancy.plans) or prices
        (accounting.pricing.plans), and the default."""
        return {DEFAULT_PLAN, *self.tenancy.plans, *self.accounting.pricing.plans}

    @classmethod
    def from_args(cls, args: Optional[dict[str, Any]]) -> "PlatformConfig":
        return cls.model_validate(args or {})

    def bases(self) -> list[BaseModelConfig]:
        """Every base, the first (the default) first. With one base, `engine` / `engine_deployment`
        are it (a copy of the config that updates them updates the base); with several, `models`
        is (`engine` is then the first's, or after for_model() that base's)."""
        if len(self.models) > 1:
            return list(self.models)
        first = self.models[0]
        if first.engine is not self.engine or first.engine_deployment is not self.engine_deployment:
            first = first.model_copy(update={"engine": self.engine, "engine_deployment": self.engine_deployment})
        return [first]

    @property
    def base_names(self) -> list[str]:
        """Every base's name, the first (the default) first."""
        return [base.model_id for base in self.bases()]

    def base(self, name: Optional[str] = None) -> BaseModelConfig:
        """The base named `name` (None: the first). KeyError names the bases there are."""
        for base in self.bases():
            if name is None or base.model_id == name:
                return base
        raise KeyError(f"no base model named {name!r}; the bases are {', '.join(self.base_names)}")

    def pool_name(self, name: Optional[str] = None) -> str:
        """The Engine deployment serving the base named `name` (None: the first)."""
        names = self.base_names
        index = 0 if name is None else names.index(self.base(name).model_id)
        return pool_deployment_name(index, names[index])

    def for_model(self, name: Optional[str]) -> "PlatformConfig":
        """This config as one base's Engine replicas see it: `engine` and `engine_deployment` are that
        base's (`models` still lists all)."""
        base = self.base(name)
        return self.model_copy(update={"engine": base.engine, "engine_deployment": base.engine_deployment})

    def for_replicas(self) -> "PlatformConfig":
        """What replicas are built with: without the replica counts and the SLOs (but for the TPOT
        target, copied into the adaptive dispatch limit and the tenant scheduler), so their init args
        do not differ by them (the Ingress gets the SLO back in loraplex/app.py)."""
        models = [self._base_for_replicas(base) for base in self.bases()]
        return self.model_copy(update={
            "models": models, "engine": models[0].engine, "engine_deployment": models[0].engine_deployment,
            "ingress": self.ingress.model_copy(update={"num_replicas": 1}),
            "slo": SloConfig(),
        })

    def _base_for_replicas(self, base: BaseModelConfig) -> BaseModelConfig:
        deployment = base.engine_deployment
        queue = deployment.fair_queue
        # The one `slo:` figure replicas use: the TPOT target of the adaptive dispatch limit...
        adaptive = queue.adaptive.model_copy(update={"tpot_s": queue.adaptive.tpot_s or self.slo.tpot_p95_s})
        # And the tenant scheduler's, which sizes shared steps by it.
        steps = base.engine.tenant_scheduler
        engine = base.engine.model_copy(update={"tenant_scheduler": steps.model_copy(
            update={"tpot_s": steps.tpot_s or self.slo.tpot_p95_s})})
        return base.model_copy(update={"engine": engine, "engine_deployment": deployment.model_copy(update={
            "num_replicas": 1, "autoscaling": None, "fair_queue": queue.model_copy(update={"adaptive": adaptive})})})

    def resolved(self, base_dir: Path) -> "PlatformConfig":
        """Pin every relative local path to base_dir: replicas run in other working dirs."""
        db, prefix = self.database_url, "sqlite:///"
        if db.startswith(prefix) and not db.startswith(prefix + "/") and db != prefix + ":memory:":
            db = prefix + str((base_dir / db[len(prefix):]).resolve())
        registry = self.registry.model_copy(update={"store_url": _local_abs(self.registry.store_url, base_dir),
                                                    "cache_dir": _local_abs(self.registry.cache_dir, base_dir)})
        accounting = self.accounting.model_copy(update={"spool_dir": _local_abs(self.accounting.spool_dir, base_dir)})
        models = [base.model_copy(update={"engine": base.engine.resolved(base_dir)}) for base in self.bases()]
        return self.model_copy(update={"models": models, "engine": models[0].engine, "database_url": db,
                                       "registry": registry, "accounting": accounting})


def pool_deployment_name(index: int, model_id: str) -> str:
    """The Engine deployment of the base at `models[index]`: `Engine` for the first (what a
    single-model config's `deployments:` and dashboards name), `Engine-<name>` for the others."""
    return DEFAULT_POOL if index == 0 else f"{DEFAULT_POOL}-{model_id.replace('/', '-')}"


def _local_abs(path_or_url: str, base_dir: Path) -> str:
    # $VAR and ~ are expanded on each replica's node (loraplex.cluster.for_this_node).
    if "://" in path_or_url or Path(path_or_url).is_absolute() or path_or_url.startswith(("$", "~")):
        return path_or_url
    return str((base_dir / path_or_url).resolve())
