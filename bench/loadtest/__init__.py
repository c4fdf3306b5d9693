"""Load test and capacity planning against any OpenAI-compatible endpoint (issue 13).

`python -m bench loadtest` runs it; the pieces are here so unit tests can import them:
arrivals (closed / Poisson / gamma), workload (tenants, Zipf mix, adapters, ShareGPT or JSONL
traces), client (one streamed request, timed), runner (a level), stats (percentiles, SLO,
capacity, replicas, cost via loraplex.accounting.cost_model), report (JSON, Markdown, plot),
targets (LoRAPlex or a bare vLLM server, started and stopped by the tool), trace_export (the
usage ledger as a JSONL trace). Not part of the served package.
"""
