"""Run a real Prometheus next to the platform (what scripts/prometheus calls): generate its
config and rules from the serve config under --data-dir, check them with promtool, then
become `prometheus` (exec), so Ctrl-C or SIGTERM stops it cleanly, with its data kept.

Needs `prometheus` and `promtool` on PATH (Debian: apt-get install prometheus).
"""
import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from loraplex.observability.rules import render_rules
from loraplex.observability.scrape_config import ray_sd_file, scrape_config
from loraplex.observability.served import load_served


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/prometheus", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", default="serve_config.yaml", help="the serve config the platform runs")
    p.add_argument("--port", type=int, default=int(os.environ.get("LORAPLEX_PROMETHEUS_PORT", 9090)),
                   help="HTTP port (default 9090, or LORAPLEX_PROMETHEUS_PORT)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for a remote Grafana)")
    p.add_argument("--data-dir", type=Path, default=Path("var/prometheus"),
                   help="config, rules and the TSDB (data/) live here (default var/prometheus)")
    p.add_argument("--ray-temp-dir", type=Path, default=None,
                   help="Ray's --temp-dir, if the cluster was started with one (default $RAY_TMPDIR or /tmp, + /ray)")
    p.add_argument("--sd-file", action="append", default=[], type=Path, metavar="PATH",
                   help="file_sd JSON listing the nodes' metrics agents, instead of Ray's own (repeatable; "
                   "e.g. what `python -m loraplex.metrics.discovery --out PATH` writes without a dashboard)")
    p.add_argument("--no-ray", action="store_true", help="do not scrape Ray's metrics export")
    p.add_argument("--target", action="append", default=[], metavar="HOST:PORT",
                   help="also scrape http://HOST:PORT/metrics (repeatable)")
    p.add_argument("--scrape-interval", type=int, default=15, metavar="SECONDS")
    p.add_argument("--retention", default="15d", help="how long to keep samples")
    p.add_argument("--alertmanager", action="append", default=[], metavar="HOST:PORT",
                   help="send firing alerts there (repeatable); without one, see them on the alerts page it prints")
    return p.parse_args(argv)


def require(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        sys.exit(f"{tool} is not on PATH: install Debian's `prometheus` package (apt-get install prometheus)")
    return path


def prepare(args: argparse.Namespace) -> list[str]:
    """Write the config and rules; return the prometheus command line."""
    # Both tools first: a missing one leaves nothing behind (no var/prometheus/ of a run that never started).
    promtool, prometheus = require("promtool"), require("prometheus")
    served = load_served(args.config)
    data = args.data_dir.resolve()
    (data / "data").mkdir(parents=True, exist_ok=True)
    rules, config = data / "rules.yml", data / "prometheus.yml"
    rules.write_text(render_rules(served))
    sd_files = [] if args.no_ray else [f.resolve() for f in args.sd_file] or [ray_sd_file(args.ray_temp_dir)]
    address = f"{args.host}:{args.port}"
    self_address = f"127.0.0.1:{args.port}" if args.host in ("0.0.0.0", "::") else address
    config.write_text(yaml.safe_dump(scrape_config(
        rules_file=rules, self_address=self_address,
        ray_sd_files=sd_files, static_targets=args.target,
        scrape_interval_s=args.scrape_interval, alertmanagers=args.alertmanager), sort_keys=False))
    for sd in sd_files:
        if not sd.exists():
            print(f"prometheus: no {sd} yet: Prometheus reads it once it is written (Ray's dashboard writes "
                  "its own; without one: --sd-file or --target NODE_IP:METRICS_EXPORT_PORT)", file=sys.stderr)
    subprocess.run([promtool, "check", "config", str(config)], check=True, stdout=subprocess.DEVNULL)
    return [prometheus, f"--config.file={config}", f"--storage.tsdb.path={data / 'data'}",
            f"--web.listen-address={address}", f"--storage.tsdb.retention.time={args.retention}"]


def alerts_path(version_text: str) -> str:
    """Where this build shows its alerts, from `prometheus --version`: Debian's build (version
    `...+ds`, branch `debian/...`) ships only the classic UI, where /alerts is a 404; current
    upstream builds only the new UI, without /classic/."""
    debian = "+ds" in version_text or "branch: debian" in version_text
    return "/classic/alerts" if debian else "/alerts"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = prepare(args)
    version = subprocess.run([command[0], "--version"], capture_output=True, text=True)
    alerts = alerts_path(version.stdout + version.stderr)
    print(f"prometheus: http://{args.host}:{args.port} (alerts at http://{args.host}:{args.port}{alerts}), "
          f"config {command[1].split('=', 1)[1]}", file=sys.stderr, flush=True)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
