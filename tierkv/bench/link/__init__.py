"""``--link``: benchmarks over a link shaped like the one users have between engine and vaults.

:mod:`.spec` parses what was asked for (``5gbit,1ms``, presets ``1gbe`` … ``25gbe``); :mod:`.netns`
builds it (two network namespaces, a shaped veth pair) for the length of a run and says what the
emulation does and does not model.
"""

from __future__ import annotations

from tierkv.bench.link.netns import Link, check_privileges, link_emulator
from tierkv.bench.link.spec import PRESETS, LinkSpec, parse_link

__all__ = ["PRESETS", "Link", "LinkSpec", "check_privileges", "link_emulator", "parse_link"]
