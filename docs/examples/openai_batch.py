"""The Batch API with the official `openai` SDK, unchanged: upload a JSONL of requests (this
directory's requests.jsonl unless a path is given), start a batch, wait for it, print each line's
answer. LORAPLEX_API_KEY: a tenant's key; LORAPLEX_URL: the server (http://127.0.0.1:8000)."""

import json
import os
import sys
import time
from pathlib import Path

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("LORAPLEX_URL", "http://127.0.0.1:8000") + "/v1",
                api_key=os.environ["LORAPLEX_API_KEY"])
path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("requests.jsonl")
with path.open("rb") as f:
    uploaded = client.files.create(file=f, purpose="batch")
batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    print(f"{batch.id}: {batch.status} {batch.request_counts}", file=sys.stderr)
    time.sleep(2)
    batch = client.batches.retrieve(batch.id)
print(f"{batch.id}: {batch.status} {batch.request_counts}", file=sys.stderr)
if batch.output_file_id:
    for line in client.files.content(batch.output_file_id).text.splitlines():
        result = json.loads(line)
        print(result["custom_id"], result["response"]["body"]["choices"][0]["message"]["content"], sep=": ")
if batch.error_file_id:  # lines the run refused: each says why
    print(client.files.content(batch.error_file_id).text, file=sys.stderr)
