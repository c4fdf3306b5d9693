"""DedicatedConfig: hot adapter versions served merged on their own Engine deployments."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class DedicatedAdapterConfig(BaseModel):
    """One adapter version served by its own Engine deployment, merged into the base weights."""

    model_config = ConfigDict(extra="forbid")

    adapter: str = Field(
        ..., description="The version as `<tenant id>/<name>@<version>`, served by a replica whose base is it "
        "merged into the served model's weights while one is healthy, else by the LoRA pool.",
    )
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs Ray reserves for the dedicated replica.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs for the dedicated replica (tensor_parallel_size on GPUs).")

    @field_validator("adapter")
    @classmethod
    def _version_ref(cls, value: str) -> str:
        tenant, slash, ref = value.partition("/")
        name, at, version = ref.partition("@")
        if not (tenant and slash and name and at and version.isdigit()):
            raise ValueError(f"dedicated adapter {value!r}: write it `<tenant id>/<name>@<version>`, "
                             "a version number (a dedicated replica serves one immutable version)")
        return value

    @property
    def tenant(self) -> str:
        return self.adapter.partition("/")[0]

    @property
    def ref(self) -> str:
        return self.adapter.partition("/")[2]


class DedicatedConfig(BaseModel):
    """Hot adapters on merged dedicated replicas (docs/operations.md#merged-dedicated-replicas)."""

    model_config = ConfigDict(extra="forbid")

    adapters: list[DedicatedAdapterConfig] = Field(
        default_factory=list,
        description="Adapter versions marked dedicated by config, beside those marked with PUT "
        "/admin/tenants/{id}/adapters/{name@version}/dedicated when the app is built.",
    )
    admin_marks: bool = Field(
        True, description="Also build a dedicated replica for each version marked through the admin "
        "route (read from the database when the app is built); false: the config's list only.")
    num_cpus: float = Field(1.0, ge=0, description="Logical CPUs of an admin-marked version's replica.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs of an admin-marked version's replica.")
    merge_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype the merged checkpoint is saved in; auto: the engine's dtype, or the base "
        "model's own when that is auto.",
    )
    health_poll_s: float = Field(
        2.0, gt=0, description="How often each ingress replica reads the dedicated deployments' health "
        "(Serve's status) and the admin marks; a mark removed elsewhere stops routing within this.")
    failure_backoff_s: float = Field(
        15.0, ge=0, description="After a call to a dedicated replica fails before its first token, its adapter "
        "goes to the LoRA pool for this long, whatever Serve's status says.")
