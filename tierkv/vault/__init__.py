"""The vault daemon: an LMDB store (store.py), its eviction policy (policy.py), the RPC handlers
(service.py) and the process lifecycle (server.py). Nothing here imports an engine or torch."""
