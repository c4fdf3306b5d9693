"""The LoRAPlex application of a Ray Serve config file, as the generators need it."""
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from loraplex.config import PlatformConfig

IMPORT_PATH = "loraplex.app:build_app"


@dataclass(frozen=True)
class ServedPlatform:
    application: str         # Serve's application name: the `application` label of Serve's metrics
    config: PlatformConfig
    # The config's `deployments:` entries, by name: Serve's overrides of what build_app sets.
    overrides: dict = field(default_factory=dict)

    def deployments(self) -> dict[str, int]:
        """The deployments' names in Serve (loraplex.app) and how many replicas each should
        have at least: `deployments:` wins over `args` (as in Serve), autoscaling its minimum."""
        # One Engine pool per base model (`Engine`, `Engine-<name>`), each alerted on alone.
        built = {self.config.pool_name(base.model_id): _at_least(base.engine_deployment.num_replicas,
                                                                  base.engine_deployment.autoscaling)
                 for base in self.config.bases()}
        built["Ingress"] = self.config.ingress.num_replicas
        for name in built:
            entry = self.overrides.get(name) or {}
            count = entry.get("num_replicas")
            built[name] = _at_least(count if isinstance(count, int) else built[name], entry.get("autoscaling_config"))
        return built


def _at_least(num_replicas: int, autoscaling) -> int:
    """Replicas a deployment has at least: its autoscaling minimum, else its fixed count."""
    return int(autoscaling.get("min_replicas", 1)) if isinstance(autoscaling, dict) else num_replicas


def load_served(path: str | Path) -> ServedPlatform:
    doc = yaml.safe_load(Path(path).read_text()) or {}
    apps = [a for a in doc.get("applications") or [] if a.get("import_path") == IMPORT_PATH]
    if len(apps) != 1:
        raise ValueError(f"{path}: expected one application with import_path {IMPORT_PATH}, found {len(apps)}")
    overrides = {d["name"]: d for d in apps[0].get("deployments") or [] if isinstance(d, dict) and "name" in d}
    return ServedPlatform(apps[0].get("name", "default"), PlatformConfig.from_args(apps[0].get("args")), overrides)
