"""SGLang: tierkv vaults as HiCache's L3 storage backend, loaded by module path.

``--hicache-storage-backend dynamic`` with ``"module_path": "tierkv.connectors.sglang", "class_name":
"TierKVStorage"`` in ``--hicache-storage-backend-extra-config`` (see :mod:`.backend`). Importing this
package imports SGLang.
"""

from tierkv.connectors.sglang.backend import SETTINGS_KEY, TierKVStorage

__all__ = ["SETTINGS_KEY", "TierKVStorage"]
