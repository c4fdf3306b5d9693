"""Request routing across engine replicas: the tenant-affinity policy and its Serve router.

Nothing here but loraplex.routing.serve_router imports Ray, so the policy is unit-tested and
simulated as plain Python; the Ray Serve RequestRouter (loraplex.routing.serve_router, imported
by Serve from its path) wraps a RoutingPolicy. The Engine replica reports what it holds with
ServedKeys / routing_stats. Comparison policies and the simulator live in bench.routing.

Import the module you need: this file imports nothing, so loading one piece (the config) does
not load the rest (the ledger, SQLAlchemy).
"""
