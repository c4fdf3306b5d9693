"""Histogram bucket boundaries (seconds), after the OpenTelemetry GenAI semantic conventions.

OpenTelemetry advises explicit boundaries for `gen_ai.server.time_to_first_token`,
`gen_ai.server.time_per_output_token` and `gen_ai.server.request.duration`. We keep its
boundaries from 10 ms up (nothing this platform measures from the ingress is faster), and extend
them where a loaded CPU replica or a long generation goes past them, so P50/P95/P99 stay inside
a finite bucket from 10 ms to 60 s (TPOT to 10 s): a quantile that falls in +Inf is only "above
the last bound".
"""

# OpenTelemetry's advice, as published in the GenAI metrics conventions.
OTEL_TIME_TO_FIRST_TOKEN = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                            5.0, 7.5, 10.0)
OTEL_TIME_PER_OUTPUT_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
OTEL_REQUEST_DURATION = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                         81.92)

# TTFT: OTel's from 10 ms, then on to 60 s (a queued request on a busy replica).
TIME_TO_FIRST_TOKEN = tuple(b for b in OTEL_TIME_TO_FIRST_TOKEN if b >= 0.01) + (15.0, 20.0, 30.0, 45.0, 60.0)
# TPOT: OTel's, then 5 and 10 s (an overloaded CPU replica).
TIME_PER_OUTPUT_TOKEN = OTEL_TIME_PER_OUTPUT_TOKEN + (5.0, 10.0)
# End-to-end and queue time: OTel's request-duration doubling, two more steps to cover the
# ingress's default 300 s deadline.
REQUEST_DURATION = OTEL_REQUEST_DURATION + (163.84, 327.68)
QUEUE_TIME = REQUEST_DURATION
# Adapter loads: a local cache hit (ms) to a download from object storage (a minute).
ADAPTER_LOAD = OTEL_REQUEST_DURATION
