"""The site's home page is the README, so the front page and the manual's first page cannot drift apart.

The README links into the manual as ``docs/...`` (right on the repository's own page); on the site those
pages sit one folder up, so the prefix goes. A link to a file outside ``docs/`` (``LICENSE``) has no page
on the site and becomes its plain name. The documentation build runs this (the ``mkdocs`` hook in
``scripts/docs_hooks.py``); ``python scripts/readme_page.py`` prints the page.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|#)")


def _site_link(match: re.Match[str]) -> str:
    text, target = match["text"], match["target"]
    if _EXTERNAL.match(target):
        return match[0]
    if target.startswith("docs/"):
        return f"[{text}]({target.removeprefix('docs/')})"
    return f"`{target}`" if text == target else text


def render(readme: str | None = None) -> str:
    """The README (``README.md`` unless given) with its links pointing where they lead on the site."""
    return _LINK.sub(_site_link, README.read_text() if readme is None else readme)


if __name__ == "__main__":
    print(render(), end="")
