"""The mlx-lm hook (extra ``tierkv[mlx]``): mlx-lm prompt caches to tierkv blobs and back.

- :mod:`~tierkv.connectors.mlx.states`: one layer cache as arrays and integers, for mlx-lm's 0.31 and
  0.32+ cache APIs;
- :mod:`~tierkv.connectors.mlx.layout`: a model's layout, KV blocks and snapshot manifests;
- :mod:`~tierkv.connectors.mlx.hook`: :class:`MlxTier`, look up before ``generate``, store after,
  over the shared pipeline (:mod:`tierkv.tiering`).

This package imports mlx; nothing outside it does.
"""

from tierkv.connectors.mlx.hook import MlxTier, Prepared, weights_fingerprint
from tierkv.connectors.mlx.layout import MlxLayout, probe
from tierkv.connectors.mlx.states import LayerState, LayoutError

__all__ = ["LayerState", "LayoutError", "MlxLayout", "MlxTier", "Prepared", "probe", "weights_fingerprint"]
