"""Hot adapters on merged dedicated replicas (issue 22 part 3; docs/operations.md).

targets.py (which versions are dedicated: the config's list and the admin marks, resolved at
build), marks.py (the admin marks in the database), path_choice.py (merged or LoRA, per call: pure),
engine_client.py (the ingress's EngineClient that sends a call down the chosen path, and falls back),
health.py (the ingress thread that reads Serve's status and the marks), replica.py (what a dedicated
Engine replica serves). The merged checkpoint itself is registry/merged_checkpoint.py.

Import the module you need: this file imports nothing.
"""
