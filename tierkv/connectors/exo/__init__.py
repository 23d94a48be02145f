"""The EXO adapter: EXO's own ``KVPrefixCache`` evictions go to the vaults, cold hits come back through it.

- :mod:`~tierkv.connectors.exo.guard`: the version and signature check the adapter activates behind;
- :mod:`~tierkv.connectors.exo.adapter`: the tiered ``KVPrefixCache`` subclass factory;
- :mod:`~tierkv.connectors.exo.autohook`: the import hook a ``.pth`` file installs in EXO's environment;
- :mod:`~tierkv.connectors.exo.install`: ``tierkv exo install / uninstall / status``.

Nothing here imports mlx or EXO at import time (the ``.pth`` line runs in every interpreter of EXO's
environment); mlx is imported when the adapter first builds its tier.
"""
