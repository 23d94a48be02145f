"""vLLM integration: ``TierKVConnector`` (KV connector API v1, hybrid-allocator aware).

Importing this package never imports vLLM; :mod:`tierkv.connectors.vllm.connector` (the module named in
``kv_connector_module_path``) and :mod:`.metrics` do. The engine-independent rules live in :mod:`.plan`,
the tensor layouts in :mod:`.layout`, the two halves in :mod:`.scheduler` and :mod:`.worker`; both reach
the vaults only through the pipeline of :mod:`tierkv.tiering` (a lazily opened ``Storage``). The one
exception is :mod:`.smoke_test`, a command-line diagnostic outside the serving path: it asks every vault
for its health and stats (which the pipeline's storage does not expose) and speaks HTTP to a running
server, so it needs no vLLM.
"""

from __future__ import annotations

MODULE_PATH = "tierkv.connectors.vllm.connector"
CONNECTOR_NAME = "TierKVConnector"

__all__ = ["CONNECTOR_NAME", "MODULE_PATH"]
