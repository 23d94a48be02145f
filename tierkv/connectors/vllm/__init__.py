"""vLLM integration: ``TierKVConnector`` (KV connector API v1, hybrid-allocator aware).

Importing this package never imports vLLM; :mod:`tierkv.connectors.vllm.connector` (the module named in
``kv_connector_module_path``) and :mod:`.metrics` do (:mod:`.smoke_test` speaks HTTP to a running server
and needs no vLLM). The engine-independent rules
live in :mod:`.plan`, the tensor layouts in :mod:`.layout`, the two halves in :mod:`.scheduler` and
:mod:`.worker`.
"""

from __future__ import annotations

MODULE_PATH = "tierkv.connectors.vllm.connector"
CONNECTOR_NAME = "TierKVConnector"

__all__ = ["CONNECTOR_NAME", "MODULE_PATH"]
