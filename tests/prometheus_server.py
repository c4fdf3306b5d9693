"""A real Prometheus for tests (Debian's `prometheus` package: server and promtool on PATH;
skipped with the reason where they are missing, a failure where CI is set)."""
import contextlib
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Iterator, Sequence

import yaml

from loopback import free_port
from missing import skip_or_fail
from waiting import wait_until


def prometheus_tool(name: str) -> str:
    """The path of `prometheus` or `promtool`, or skip/fail."""
    path = shutil.which(name)
    if path is None:
        skip_or_fail(f"{name} is not on PATH (apt-get install prometheus)")
    return path


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {proc.returncode}")
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as r:
            return r.status == 200
    wait_until(ready, timeout_s, f"prometheus at {url} to be ready")


def stop(proc: subprocess.Popen, timeout_s: float = 30) -> int:
    """SIGTERM and wait: Prometheus shuts down cleanly (exit 0) within the timeout."""
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"prometheus did not stop within {timeout_s} s of SIGTERM")


@contextlib.contextmanager
def throwaway_prometheus(workdir: Path, scrape_interval: str = "1s", targets: Sequence[str] = (),
                         rule_files: Sequence[Path] = ()) -> Iterator[str]:
    """A Prometheus on a free loopback port with its TSDB under workdir, scraping itself and
    `targets` (host:port serving /metrics: e.g. a Ray node's metrics export port, for a cluster
    started without the dashboard, which writes no service-discovery file) with `rule_files`
    loaded; yields its URL (http://127.0.0.1:PORT)."""
    binary = prometheus_tool("prometheus")
    port = free_port()
    config = workdir / "prometheus.yml"
    jobs = [{"job_name": "prometheus", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}]
    if targets:
        # A Ray node's export is large (every series of every process on the node) and renders in
        # Python: under load it takes over a second, so a 1 s scrape would time out (`up` 0).
        jobs.append({"job_name": "ray", "scrape_interval": "5s", "scrape_timeout": "5s",
                     "static_configs": [{"targets": list(targets)}]})
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(f) for f in rule_files], "scrape_configs": jobs}))
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url
    finally:
        stop(proc)
        log.close()
