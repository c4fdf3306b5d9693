"""The platform the store drills run against, started by the drill itself: their faults need the
stores in the drill's hands (a server to freeze, a proxy to slow, disks to fill), which a platform
someone else started does not give. So one `serve run` (bench/serve_run.py, as every benchmark
starts it) of serve_config.yaml with only the stores changed:

- `database_url`: a throwaway PostgreSQL database, reached through tests/delay_proxy.py (0 s late
  until the slow-db drill sets a latency);
- `registry.store_url`: `s3://` on a moto S3 server on loopback (tests/moto_s3.py), frozen by the
  store-down drill (SIGSTOP, as tests/e2e/test_postgres_s3.py does);
- `accounting.spool_dir`, `registry.cache_dir`: each on its own size-limited tmpfs (tests/small_disk.py;
  needs root), filled by the spool-full and cache-full drills.

The stores' helpers are the tests' own (tests/ on sys.path, as bench/scenarios/ledger.py does):
one way to start each."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from bench.processes import ROOT, free_port
from bench.serve_run import ServeRun

BUCKET, PREFIX = "loraplex-drill", "adapters"


@dataclass
class DrillPlatform:
    base_url: str
    admin_token: str
    database_url: str       # direct, not through the proxy: the drill's own ledger reads are not slowed
    store_url: str
    proxy: object           # tests/delay_proxy.DelayProxy between the platform and PostgreSQL
    moto_pid: int
    spool_dir: Path
    cache_dir: Path
    log_path: Path

    def freeze_store(self) -> None:
        """The S3 server stops answering, its connections open: a hung store, the harder case."""
        os.kill(self.moto_pid, signal.SIGSTOP)

    def thaw_store(self) -> None:
        os.kill(self.moto_pid, signal.SIGCONT)


def drill_config(database_url: str, store_url: str, storage_options: dict, spool_dir: Path, cache_dir: Path,
                 port: int, store_timeout_s: float) -> dict:
    """serve_config.yaml with the drill's stores and port; everything else as shipped."""
    import yaml

    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    args["database_url"] = database_url
    args["registry"] = {**args.get("registry", {}), "store_url": store_url, "storage_options": storage_options,
                        "cache_dir": str(cache_dir), "store_timeout_s": store_timeout_s}
    args["accounting"] = {**args.get("accounting", {}), "spool_dir": str(spool_dir)}
    return config


@contextlib.contextmanager
def drill_platform(spool_size: str, cache_size: str, store_timeout_s: float) -> Iterator[DrillPlatform]:
    import yaml

    for path in (ROOT / "tests", ROOT / "tests" / "e2e"):
        sys.path.insert(0, str(path))
    from delay_proxy import DelayProxy
    from moto_s3 import SERVERS
    from shared_stores import postgres_and_s3
    from small_disk import small_disk
    from sqlalchemy.engine import make_url

    tmp = Path(tempfile.mkdtemp(prefix="loraplex-drill-"))
    with contextlib.ExitStack() as stack:
        stores = stack.enter_context(postgres_and_s3(BUCKET))
        db = make_url(stores.db_url)
        proxy = stack.enter_context(DelayProxy(db.host or "127.0.0.1", db.port or 5432))
        spool = stack.enter_context(small_disk(tmp / "spool", spool_size))
        cache = stack.enter_context(small_disk(tmp / "cache", cache_size))
        port = free_port()
        store_url = f"s3://{BUCKET}/{PREFIX}"
        config = drill_config(proxy.url_for(stores.db_url), store_url, stores.storage_options, spool, cache,
                              port, store_timeout_s)
        (tmp / "serve_config.yaml").write_text(yaml.safe_dump(config))
        token = secrets.token_urlsafe(16)
        log = tmp / "serve_run.log"
        run = stack.enter_context(ServeRun(tmp / "serve_config.yaml", port=port, log_path=log, admin_token=token))
        print(f"  serve run of {tmp / 'serve_config.yaml'} on port {port}; log {log}", file=sys.stderr)
        run.wait_ready(900)
        yield DrillPlatform(base_url=run.base_url, admin_token=token, database_url=stores.db_url,
                            store_url=store_url, proxy=proxy, moto_pid=SERVERS[stores.endpoint].pid,
                            spool_dir=spool, cache_dir=cache, log_path=log)
