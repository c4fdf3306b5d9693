"""prometheus.yml for a Prometheus next to the platform.

Two ways to find the replicas' metrics, both on by choice:
- Ray's metrics export (job `ray`): every Ray node's metrics agent serves the `ray.util.metrics`
  of all processes on that node; the head writes the agents' addresses (every node of a
  multi-node cluster) to `prom_metrics_service_discovery.json` in the Ray session dir, which
  Prometheus follows with file_sd. This finds new nodes and sessions without a restart.
- static targets (job `loraplex`): `host:port` serving `/metrics` (an ingress's aggregate).
"""
import os
from pathlib import Path

from loraplex.observability import names as n
from loraplex.observability.promql import duration

SD_FILE = "prom_metrics_service_discovery.json"


def ray_temp_dir() -> Path:
    """Where Ray keeps its sessions unless started with --temp-dir (Ray's own default, restated
    so this needs no Ray import)."""
    return Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp") / "ray"


def ray_sd_file(temp_dir: Path | None = None) -> Path:
    return (temp_dir or ray_temp_dir()) / "session_latest" / SD_FILE


def scrape_config(*, rules_file: Path, self_address: str, ray_sd_files: list[Path], static_targets: list[str],
                  scrape_interval_s: int = 15, alertmanagers: list[str] = ()) -> dict:
    interval = duration(scrape_interval_s)
    jobs = [{"job_name": "prometheus", "static_configs": [{"targets": [self_address]}]}]
    if ray_sd_files:
        # The file is replaced atomically and session_latest moves on a Ray restart: re-read often.
        jobs.append({"job_name": n.RAY_JOB, "file_sd_configs": [
            {"files": [str(f) for f in ray_sd_files], "refresh_interval": "30s"}]})
    if static_targets:
        jobs.append({"job_name": n.STATIC_JOB, "metrics_path": "/metrics",
                     "static_configs": [{"targets": list(static_targets)}]})
    config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
              "rule_files": [str(rules_file)], "scrape_configs": jobs}
    if alertmanagers:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
    return config
