"""CHANGELOG.md keeps Keep a Changelog's link references, all into the project's own repository
(pyproject's ``Source`` URL), so that each heading links to what changed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEADING = re.compile(r"^## \[(?P<name>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?$", re.M)
REFERENCE = re.compile(r"^\[(?P<name>[^\]]+)\]: (?P<url>\S+)$", re.M)


def source_url() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return str(project["urls"]["Source"])


def expected_links(names: list[str], source: str) -> dict[str, str]:
    """Unreleased compares with the last release (or lists main's commits before the first);
    each release compares with the one before it (the first one is its tag)."""
    releases = names[1:] if names and names[0] == "Unreleased" else names
    links = {
        "Unreleased": f"{source}/compare/v{releases[0]}...HEAD"
        if releases
        else f"{source}/commits/main"
    }
    for index, newer in enumerate(releases):
        older = releases[index + 1] if index + 1 < len(releases) else None
        links[newer] = (
            f"{source}/compare/v{older}...v{newer}" if older else f"{source}/releases/tag/v{newer}"
        )
    return links


def test_every_heading_has_its_link_reference_into_the_repository() -> None:
    text = (REPO / "CHANGELOG.md").read_text()
    names = [m["name"] for m in HEADING.finditer(text)]
    assert names and names[0] == "Unreleased"
    assert all(m["date"] for m in HEADING.finditer(text) if m["name"] != "Unreleased")
    references = {m["name"]: m["url"] for m in REFERENCE.finditer(text)}
    assert references == expected_links(names, source_url())


def test_the_expected_links_follow_keep_a_changelog() -> None:
    source = "https://example.org/p"
    assert expected_links(["Unreleased"], source) == {"Unreleased": f"{source}/commits/main"}
    assert expected_links(["Unreleased", "0.2.0", "0.1.0"], source) == {
        "Unreleased": f"{source}/compare/v0.2.0...HEAD",
        "0.2.0": f"{source}/compare/v0.1.0...v0.2.0",
        "0.1.0": f"{source}/releases/tag/v0.1.0",
    }
