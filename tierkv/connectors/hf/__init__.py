"""transformers integration: ``TieredSession`` reuses KV from a hot tier in process and from vaults.

::

    from tierkv.config import load_config
    from tierkv.connectors.hf import TieredSession
    from tierkv.tiering import open_cluster

    vaults = open_cluster(load_config())  # or roles={"kv_cold": ["127.0.0.1:50051"], ...}
    s = TieredSession(model, vaults, codec="raw", block_size=16, hot_bytes=1 << 30)
    out = s.generate(input_ids, max_new_tokens=32)
    s.last_stats  # restored_tokens, computed_tokens, hot_hits, cold_hits, bytes_fetched, ttft_s, ...
"""

from tierkv.extras import require

require("torch", "tierkv.connectors.hf")  # before the imports below: a missing torch names the extra

from tierkv.connectors.hf.layout import CacheLayout, StateSnapshot, probe_layout  # noqa: E402
from tierkv.connectors.hf.session import ClusterLike, TieredSession  # noqa: E402
from tierkv.connectors.hf.stats import GenerationStats  # noqa: E402
from tierkv.connectors.hf.streams import weights_fingerprint  # noqa: E402
from tierkv.connectors.hf.text import encode_with_offsets  # noqa: E402

__all__ = [
    "CacheLayout",
    "ClusterLike",
    "GenerationStats",
    "StateSnapshot",
    "TieredSession",
    "encode_with_offsets",
    "probe_layout",
    "weights_fingerprint",
]
