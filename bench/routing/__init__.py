"""Routing policies to compare tenant affinity against, and the trace simulator that compares
them. Every policy here is a loraplex.routing.RoutingPolicy: the simulator runs it as plain
Python, and TenantAffinityRouter runs it on real replicas when `routing.policy` names it by
import path (bench.routing.policies.serve_policy gives that path)."""
