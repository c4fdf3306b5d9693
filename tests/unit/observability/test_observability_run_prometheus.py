"""scripts/prometheus runs a real Prometheus that finds replicas through Ray's service-discovery
file and through --target, loads the generated rules, keeps its data where told and stops
cleanly on SIGTERM. A small HTTP server stands in for a Ray node's metrics agent."""
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: shared helpers
from prometheus_server import free_port, prometheus_tool, stop, wait_ready  # noqa: E402
from waiting import wait_until  # noqa: E402

from loraplex.observability.names import KV_USAGE, RAY_JOB, STATIC_JOB, TTFT  # noqa: E402
from loraplex.observability.panel_data import instant_query  # noqa: E402
from loraplex.observability.run_prometheus import alerts_path, parse_args, prepare  # noqa: E402
from loraplex.observability.scrape_config import SD_FILE  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
EXPOSITION = f'# TYPE {KV_USAGE} gauge\n{KV_USAGE}{{replica="r1"}} 0.5\n'.encode()


class _Metrics(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(EXPOSITION)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_endpoint():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _ray_session(temp_dir: Path, target: str) -> None:
    """What a Ray head writes: session_latest -> the session dir, holding the SD file."""
    session = temp_dir / "session_2026-01-01_00-00-00_000000_1"
    session.mkdir(parents=True)
    (session / SD_FILE).write_text(json.dumps([{"labels": {"job": "ray"}, "targets": [target]}]))
    (temp_dir / "session_latest").symlink_to(session)


def test_scripts_prometheus_scrapes_ray_and_static_targets_and_stops_cleanly(tmp_path, metrics_endpoint):
    prometheus_tool("prometheus")
    _ray_session(tmp_path / "ray", metrics_endpoint)
    port, data = free_port(), tmp_path / "prom"
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [str(ROOT / "scripts" / "prometheus"), "serve_config.yaml", "--port", str(port), "--data-dir", str(data),
         "--ray-temp-dir", str(tmp_path / "ray"), "--target", metrics_endpoint, "--scrape-interval", "1"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT / "platform")})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        jobs = wait_until(lambda: {s["metric"]["job"] for s in instant_query(url, KV_USAGE)} >= {RAY_JOB, STATIC_JOB}
                          and {s["metric"]["job"] for s in instant_query(url, KV_USAGE)}, 60,
                          "both the Ray SD target and the static target to be scraped")
        assert jobs == {RAY_JOB, STATIC_JOB}
        with urllib.request.urlopen(f"{url}/api/v1/rules") as r:
            rules = {rule["name"] for g in json.load(r)["data"]["groups"] for rule in g["rules"]}
        assert {"LoraplexKVCacheNearlyFull", "LoraplexTTFTOverSLO", "LoraplexUsageSpoolNotFlushing"} <= rules
    finally:
        proc.send_signal(signal.SIGTERM)
        code = stop(proc)
        log.close()
    assert code == 0, (tmp_path / "prometheus.log").read_text()[-2000:]
    assert "See you next time" in (tmp_path / "prometheus.log").read_text()
    assert (data / "prometheus.yml").exists() and (data / "rules.yml").exists() and any((data / "data").iterdir())


def test_scripts_prometheus_explains_a_missing_binary(tmp_path):
    bin_dir = tmp_path / "bin"  # a PATH with the shell tools the script uses, and no prometheus
    bin_dir.mkdir()
    for tool in ("bash", "dirname"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {**os.environ, "PATH": str(bin_dir), "PYTHONPATH": str(ROOT / "platform")}
    data_dir = tmp_path / "prometheus"
    result = subprocess.run([str(ROOT / "scripts" / "prometheus"), "--data-dir", str(data_dir), "--no-ray"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "apt-get install prometheus" in result.stderr
    assert not data_dir.exists()  # nothing left behind by a run that could not start


def test_options_shape_the_generated_config(tmp_path, monkeypatch):
    prometheus_tool("promtool")
    monkeypatch.chdir(ROOT)
    sd = tmp_path / "targets.json"
    command = prepare(parse_args(["serve_config.gpu.yaml", "--data-dir", str(tmp_path / "p"), "--port", "9999",
                                  "--host", "0.0.0.0", "--sd-file", str(sd), "--target", "10.0.0.5:8000",
                                  "--alertmanager", "10.0.0.9:9093", "--scrape-interval", "30", "--retention", "2d"]))
    config = yaml.safe_load((tmp_path / "p" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs[RAY_JOB]["file_sd_configs"][0]["files"] == [str(sd)]
    assert jobs[STATIC_JOB]["static_configs"][0]["targets"] == ["10.0.0.5:8000"]
    assert jobs["prometheus"]["static_configs"][0]["targets"] == ["127.0.0.1:9999"]
    assert config["global"]["scrape_interval"] == "30s"
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["10.0.0.9:9093"]
    assert f"rate({TTFT}_bucket[5m]))) > 0.5\n" in (tmp_path / "p" / "rules.yml").read_text()  # the GPU SLO
    assert "--web.listen-address=0.0.0.0:9999" in command and "--storage.tsdb.retention.time=2d" in command

    prepare(parse_args(["--data-dir", str(tmp_path / "q"), "--no-ray"]))
    jobs = [j["job_name"] for j in yaml.safe_load((tmp_path / "q" / "prometheus.yml").read_text())["scrape_configs"]]
    assert jobs == ["prometheus"]


def test_it_points_at_the_alerts_page_this_build_serves():
    # Issue 46: Debian's build has only the classic UI (/alerts is a 404 there); upstream's only the new one.
    debian = "prometheus, version 2.42.0+ds (branch: debian/sid, revision: 2.42.0+ds-5+b5)"
    upstream = "prometheus, version 3.5.0 (branch: HEAD, revision: 8be3a9560fbdd18a94dedec4b747c35178177202)"
    assert alerts_path(debian) == "/classic/alerts"
    assert alerts_path(upstream) == "/alerts"
