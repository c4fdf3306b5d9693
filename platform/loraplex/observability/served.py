"""The LoRAPlex application of a Ray Serve config file, as the generators need it."""
from dataclasses import dataclass
from pathlib import Path

import yaml

from loraplex.config import PlatformConfig

IMPORT_PATH = "loraplex.app:build_app"


@dataclass(frozen=True)
class ServedPlatform:
    application: str         # Serve's application name: the `application` label of Serve's metrics
    config: PlatformConfig

    # The deployments' names in Serve (loraplex.app) and how many replicas each should have.
    def deployments(self) -> dict[str, int]:
        return {"Engine": self.config.engine_deployment.num_replicas, "Ingress": self.config.ingress.num_replicas}


def load_served(path: str | Path) -> ServedPlatform:
    doc = yaml.safe_load(Path(path).read_text()) or {}
    apps = [a for a in doc.get("applications") or [] if a.get("import_path") == IMPORT_PATH]
    if len(apps) != 1:
        raise ValueError(f"{path}: expected one application with import_path {IMPORT_PATH}, found {len(apps)}")
    return ServedPlatform(apps[0].get("name", "default"), PlatformConfig.from_args(apps[0].get("args")))
