"""What a replica on another node needs, and the refusal of node-local state on a multi-node cluster.

Every piece of state a replica reads or writes must reach it without the first node's disk:
tenants, keys, the adapter catalog and the usage ledger in `database_url` (PostgreSQL), adapter
weights in `registry.store_url` (s3://, gs://, ... through fsspec; each node keeps its own copy in
`registry.cache_dir`), the base model at a path or id every node can read, the config and the
admin token through Serve (build_app pins them into the replicas' init args). What is node-local
by design: the adapter cache and the usage spool (each replica's own, flushed to the database).

The check runs twice:
- in build_app (the deploy): on a cluster with more than one alive node, a SQLite database or a
  node-local adapter store is refused, and Serve shows the message as the app's DEPLOY_FAILED
  status (`serve status`);
- in every replica's constructor: a replica that would use node-local state on a node other than
  the one the app was built on refuses to start (a cluster that had one node at deploy time and
  grew since, e.g. by the autoscaler). Serve retries it and reports the message in the
  deployment's status; the replicas on the first node keep serving with their (correct) state.
  A replica on the node the app was built on always starts: its state is where it looks.
An Engine replica also refuses a local model path that does not exist on its node.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from pydantic import SecretStr

if TYPE_CHECKING:  # annotations only: replicas (engine/, ingress/) import this module, and the config imports theirs
    from loraplex.config import PlatformConfig

DOCS = "docs/deploy.md"
LOCAL_PROTOCOLS = {"file", "local", "memory", "simplecache", "filecache", "blockcache"}


class NodeLocalStateError(RuntimeError):
    """The config keeps state on one node's disk, and the app runs (or would run) on several."""


def store_is_node_local(url: str) -> bool:
    """A plain path, file://, memory:// (one process!) or a cache over one of them."""
    from fsspec.utils import get_protocol

    return all(get_protocol(part) in LOCAL_PROTOCOLS for part in url.split("::") if part)


def node_local_problems(config: PlatformConfig) -> list[str]:
    """One sentence per piece of shared state the config keeps on a single node, with its fix."""
    problems = []
    if config.database_url.startswith("sqlite"):
        problems.append(
            f"database_url is SQLite ({config.database_url}): each node would keep its own tenants, "
            "keys, adapter catalog and usage ledger. Fix: set database_url to a PostgreSQL database "
            "every node reaches (postgresql://user:password@host:5432/loraplex).")
    if store_is_node_local(config.registry.store_url) and not config.registry.store_shared:
        problems.append(
            f"registry.store_url is a node-local directory ({config.registry.store_url}): an adapter "
            "uploaded through one node's ingress would be missing on the others. Fix: set store_url "
            "to an object store (s3://bucket/prefix or gs://bucket/prefix, credentials in "
            "storage_options), or, if that path is a filesystem every node mounts (NFS, EFS), set "
            "registry.store_shared: true.")
    return problems


def alive_node_ids() -> list[str]:
    import ray

    return [n["NodeID"] for n in ray.nodes() if n.get("Alive")]


def this_node_id() -> Optional[str]:
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def refusal(problems: list[str], nodes: int, where: str) -> str:
    return (f"LoRAPlex refuses to run {where} on a multi-node Ray cluster ({nodes} alive nodes) with "
            f"node-local state: " + " ".join(problems) + f" See {DOCS}.")


def check_at_build(config: PlatformConfig, nodes: Optional[list[str]] = None) -> Optional[str]:
    """Called by build_app. Raise NodeLocalStateError on a multi-node cluster with node-local
    state; return the id of the node the app is built on (None outside Ray), which the replicas
    compare with their own."""
    import ray

    if nodes is None and not ray.is_initialized():
        return None
    nodes = alive_node_ids() if nodes is None else nodes
    problems = node_local_problems(config)
    if problems and len(nodes) > 1:
        raise NodeLocalStateError(refusal(problems, len(nodes), "this app"))
    return this_node_id()


def check_on_replica(config: PlatformConfig, home_node_id: Optional[str], role: str,
                     node_id: Optional[str] = None, nodes: Optional[list[str]] = None) -> None:
    """Called by every replica's constructor: refuse node-local state away from its home node.
    `home_node_id` is the node build_app ran on (None: built outside Ray, nothing to compare)."""
    node_id = node_id if node_id is not None else this_node_id()
    if home_node_id is None or node_id is None or node_id == home_node_id:
        return
    problems = node_local_problems(config)
    if not problems:
        return
    nodes = alive_node_ids() if nodes is None else nodes
    if len(nodes) > 1:
        raise NodeLocalStateError(refusal(problems, len(nodes), f"the {role} replica on node {node_id[:12]} "
                                          f"(the app was deployed on node {home_node_id[:12]})"))


def check_model_on_this_node(model: str) -> None:
    """An Engine replica's base model: a local path must exist on the replica's own node."""
    if Path(model).is_absolute() and not Path(model).exists():
        raise NodeLocalStateError(
            f"engine.model {model} does not exist on this node ({this_node_id() or 'local'}): on a "
            "multi-node cluster the model must be at a path every node can read (the same path in "
            "every node's image, or a shared volume), or be a model id each node can download. "
            f"See {DOCS}.")


def expand_node_path(path: str) -> str:
    """Node-local paths (cache_dir, spool_dir) may name environment variables ($VAR, ~), expanded
    on each node: a machine that runs several nodes gives each its own directory."""
    return os.path.expanduser(os.path.expandvars(path))


def for_this_node(config: PlatformConfig) -> PlatformConfig:
    """The config as a replica on this node uses it: node-local paths expanded here."""
    registry = config.registry.model_copy(update={"cache_dir": expand_node_path(config.registry.cache_dir)})
    accounting = config.accounting.model_copy(update={"spool_dir": expand_node_path(config.accounting.spool_dir)})
    return config.model_copy(update={"registry": registry, "accounting": accounting})


def pin_admin_token(config: PlatformConfig, token: Optional[str]) -> PlatformConfig:
    """The admin token resolved where the app is built (the env var there, else the config),
    carried to every replica in its init args: a node started without the env var still has it."""
    if not token:
        return config
    return config.model_copy(update={"tenancy": config.tenancy.model_copy(update={"admin_token": SecretStr(token)})})


def without_admin_token(config: PlatformConfig) -> PlatformConfig:
    """What Engine and merged replicas are built with: no admin token (least privilege; only the
    Ingress answers /admin). The env var is dropped too: a replica never resolves one itself."""
    return config.model_copy(update={"tenancy": config.tenancy.model_copy(update={"admin_token": None})})

