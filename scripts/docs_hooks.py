"""MkDocs hooks: pages generated at build time, so what they show is what the code holds.

``operations/config.md`` carries a marker that becomes the configuration reference generated from the
settings schema (:mod:`config_reference`); ``--strict`` turns a key missing from tierkv.toml.example into a
failed build.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import config_reference

MARKER = "<!-- generated: config reference -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fill the marker of the configuration page with the generated reference."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_reference.render())
