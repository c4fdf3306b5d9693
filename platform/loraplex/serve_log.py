"""keep_serve_log_open: Serve's replica log survives vLLM's logging setup in a replica.

vLLM configures Python logging with `logging.config.dictConfig` when first imported and again
when its engine starts, and dictConfig closes every handler in the process, Serve's among them.
Serve's replica logger writes through a MemoryHandler, whose close drops its target (the log
file). The replica goes on serving, but its log file gets nothing more, and a Serve controller
that restarts and recovers the replica asks it for that file (`get_component_logger_file_path`),
fails on the missing target and replaces the replica, cutting everything it runs.

The replicas import vLLM in their constructor (the app's build must not), after Serve has set its
logger up: they call this first, and Serve's buffered handlers then only flush when closed (their
file handler, closed too, opens its file again on the next record).
"""

from __future__ import annotations

import logging
import logging.handlers

SERVE_LOGGER = "ray.serve"  # ray.serve._private.constants.SERVE_LOGGER_NAME


def keep_serve_log_open(logger_name: str = SERVE_LOGGER) -> None:
    """Serve's buffered log handlers in this process keep their targets when logging is configured again."""
    for handler in logging.getLogger(logger_name).handlers:
        if isinstance(handler, logging.handlers.MemoryHandler):
            handler.close = handler.flush  # what close does, less dropping the target
