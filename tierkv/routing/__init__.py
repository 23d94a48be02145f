"""Cache-aware routing across engine replicas: KV event plumbing for routers and the page table.

An existing router (vllm-router ``kv_aware``) does the routing; this package carries the engines' KV
events to it on loopback (:mod:`tierkv.routing.forward`) and shows operators where context lives
(:mod:`tierkv.routing.pages`).
"""
