"""Where Prometheus scrapes the platform: every Ray node's metrics agent.

Every process of a Ray node (each Engine and Ingress replica, the router in it) pushes its
`ray.util.metrics` values to the node's metrics agent, which serves them all in Prometheus text at
`http://<node>:<metrics export port>/metrics`. One node: one target shows every replica on it. A
multi-node cluster: one target per node, the list Ray itself keeps (`ray.nodes()`), which is what
this returns and what Ray's dashboard writes to `<session dir>/prom_metrics_service_discovery.json`
(only when the dashboard runs; `write_file_sd` writes the same file without it).

    python -m loraplex.metrics.discovery [--address auto] [--out targets.json]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def scrape_targets() -> list[str]:
    """`host:port` of the metrics agent of every live node of the Ray cluster this process is
    connected to (call ray.init first)."""
    import ray

    targets = []
    for node in ray.nodes():
        port = node.get("MetricsExportPort")
        if not (node.get("Alive", node.get("alive")) and port):
            continue
        host = node["NodeManagerAddress"]
        targets.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return targets


def file_sd(targets: list[str], job: str = "ray") -> list[dict]:
    """Prometheus file_sd content, in the shape Ray's own discovery file has."""
    return [{"labels": {"job": job}, "targets": list(targets)}]


def write_file_sd(path: str | os.PathLike, targets: list[str]) -> None:
    """Atomically (Prometheus may read it at any time)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(file_sd(targets)))
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", default="auto", help="Ray cluster to ask (default: the local one)")
    ap.add_argument("--out", help="write a Prometheus file_sd JSON here (default: print the targets)")
    args = ap.parse_args()
    import ray

    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    try:
        targets = scrape_targets()
    finally:
        ray.shutdown()
    if args.out:
        write_file_sd(args.out, targets)
    else:
        print("\n".join(targets))


if __name__ == "__main__":
    main()
