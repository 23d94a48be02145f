"""LMCache: tierkv vaults as a remote storage plugin, loaded by module path.

``remote_storage_plugins: ["tierkv"]`` with ``remote_storage_plugin.tierkv.module_path:
tierkv.connectors.lmcache`` and ``class_name: TierKVConnector`` in ``extra_config`` (see
:mod:`.connector`). Importing this package imports LMCache.
"""

from tierkv.connectors.lmcache.connector import TierKVConnector, plugin_settings

__all__ = ["TierKVConnector", "plugin_settings"]
