"""The shared stores a multi-replica deployment runs on, for the end-to-end tests: a throwaway
PostgreSQL database and a moto S3 server on loopback with one bucket made."""

import contextlib
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from missing import skip_or_fail  # noqa: E402
from loopback import ServerUnavailable  # noqa: E402
from moto_s3 import moto_s3  # noqa: E402
from postgres import PostgresUnavailable, throwaway_postgres  # noqa: E402

S3_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, **S3_CREDENTIALS)


@contextlib.contextmanager
def postgres_and_s3(bucket: str) -> Iterator[SimpleNamespace]:
    """Yield db_url, endpoint and storage_options (fsspec's, for the registry's store_url
    s3://bucket/...); skip when PostgreSQL or moto is missing (fail under CI)."""
    with contextlib.ExitStack() as resources:
        try:
            db_url = resources.enter_context(throwaway_postgres())
        except PostgresUnavailable as exc:
            skip_or_fail(f"PostgreSQL not available: {exc}")
        try:
            endpoint = resources.enter_context(moto_s3())
        except ServerUnavailable as exc:
            skip_or_fail(str(exc))
        s3_client(endpoint).create_bucket(Bucket=bucket)
        options = {"key": "testing", "secret": "testing",
                   "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}
        yield SimpleNamespace(db_url=db_url, endpoint=endpoint, storage_options=options)
