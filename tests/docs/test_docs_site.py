"""The documentation site hangs together: every page is in the navigation and linked from the home page, so
nobody has to know a page exists to find it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(path.name for path in DOCS.glob("*.md"))


def _nav_pages(nav) -> set[str]:
    found: set[str] = set()
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            if isinstance(value, list):
                found |= _nav_pages(value)
            else:
                found.add(value)
    return found


def test_the_pages_are_found():
    assert {"configuration.md", "troubleshooting.md", "glossary.md", "deployment.md", "cli.md"} <= set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_is_in_the_navigation(page):
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    assert page in _nav_pages(nav), f"docs/{page} is not in mkdocs.yml's nav: add it under its readers' section"


@pytest.mark.parametrize("page", [page for page in PAGES if page != "index.md"])
def test_the_home_page_links_every_page(page):
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    stem = page.removesuffix(".md")
    assert f"]({page}" in index or f'href="../{stem}/"' in index, (
        f"docs/index.md does not link docs/{page}: add it to the 'Where to read' table"
    )
