"""serve_log_kept: Serve's replica log survives vLLM's first import in a replica.

vLLM configures Python logging when first imported (`logging.config.dictConfig`), and dictConfig
closes every handler in the process, Serve's among them. Serve's replica logger writes through a
MemoryHandler, whose close drops its target (the log file). The replica goes on serving, but
its log file gets nothing more, and a Serve controller that restarts and recovers the replica
asks it for that file (`get_component_logger_file_path`), fails on the missing target and
replaces the replica, cutting everything it runs.

The replicas import vLLM in their constructor (the app's build must not), after Serve has set its
logger up; this puts each MemoryHandler's target back (a closed file handler opens its file again
on the next record).
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
from typing import Iterator

SERVE_LOGGER = "ray.serve"  # ray.serve._private.constants.SERVE_LOGGER_NAME


@contextlib.contextmanager
def serve_log_kept(logger_name: str = SERVE_LOGGER) -> Iterator[None]:
    """Around an import that may configure logging: Serve's buffered log handlers keep their targets."""
    handlers = [(h, h.target) for h in logging.getLogger(logger_name).handlers
                if isinstance(h, logging.handlers.MemoryHandler)]
    try:
        yield
    finally:
        for handler, target in handlers:
            if handler.target is None and target is not None:
                handler.setTarget(target)
