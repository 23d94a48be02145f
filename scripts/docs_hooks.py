"""MkDocs hooks: pages generated at build time, so what they show is what the code holds.

``operations/config.md`` carries a marker that becomes the configuration reference generated from the
settings schema (:mod:`config_reference`); ``--strict`` turns a key missing from tierkv.toml.example into a
failed build. ``index.md`` carries one that becomes the README (:mod:`readme_page`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import config_reference
import readme_page

MARKER = "<!-- generated: config reference -->"
README_MARKER = "<!-- generated: README -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fill the markers: the configuration page's with the generated reference, the home page's with the
    README."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, config_reference.render())
    if README_MARKER in markdown:
        markdown = markdown.replace(README_MARKER, readme_page.render())
    return markdown
