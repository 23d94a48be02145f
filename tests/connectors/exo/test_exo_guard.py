"""The EXO adapter's activation guard against the stand-in EXO cache module (EXO itself cannot be installed
here: it needs Python 3.13 and a Rust module). Matching signatures activate; any mismatch is refused with
a message naming it."""

from __future__ import annotations

import types
from typing import Any

import pytest

from tests.connectors.exo import standin
from tierkv.connectors.exo.guard import GuardError, check, problems

VERSION = "0.3.68"


def _module(**overrides: Any) -> types.ModuleType:
    module = types.ModuleType("exo.worker.engines.mlx.cache")
    for name in ("KVPrefixCache", "snapshot_ssm_states", "has_non_kv_caches", "CacheSnapshot"):
        setattr(module, name, getattr(standin, name))
    for name, value in overrides.items():
        setattr(module, name, value)
    return module


def test_matching_exo_passes() -> None:
    assert problems(_module(), VERSION) == []
    check(_module(), VERSION)


def test_other_version_is_refused() -> None:
    with pytest.raises(GuardError, match=r"exo version '0.4.0' is not supported"):
        check(_module(), "0.4.0")
    with pytest.raises(GuardError, match="exo version None"):
        check(_module(), None)


def test_changed_signature_is_refused() -> None:
    class Renamed(standin.KVPrefixCache):
        def get_kv_cache(
            self, model: Any, tokens: Any, media_regions: Any = None
        ) -> Any:  # renamed parameter
            return super().get_kv_cache(model, tokens, media_regions)

    with pytest.raises(GuardError, match=r"KVPrefixCache.get_kv_cache\(.*'tokens'.*differs"):
        check(_module(KVPrefixCache=Renamed), VERSION)


def test_missing_method_and_attribute_are_refused() -> None:
    class NoEvict(standin.KVPrefixCache):
        _evict_if_needed = None  # type: ignore[assignment]

    assert problems(_module(KVPrefixCache=NoEvict), VERSION) == ["KVPrefixCache._evict_if_needed is missing"]

    class NoSnapshots(standin.KVPrefixCache):
        def __init__(self, group: Any) -> None:
            super().__init__(group)
            del self._snapshots

    assert problems(_module(KVPrefixCache=NoSnapshots), VERSION) == [
        "KVPrefixCache has no list attribute '_snapshots'"
    ]


def test_missing_module_function_is_refused() -> None:
    module = _module()
    del module.snapshot_ssm_states
    with pytest.raises(GuardError, match="lacks snapshot_ssm_states"):
        check(module, VERSION)
