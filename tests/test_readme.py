"""The README stays an operator's short guide (issue 26, item 6): at most MAX_LINES lines, the details in docs/, and
every relative link in it leads somewhere that exists, so moving a page does not leave the README pointing at
nothing."""

from __future__ import annotations

import re

from tests.conftest import ROOT

README = ROOT / "README.md"
MAX_LINES = 250
# Links that may point at a file not written yet, each with the reason.
NOT_YET = {
    # The key reference is generated from the configuration schema
    # (`python run_pipeline.py schema --markdown docs/config.md`); the README links it before it exists.
    "docs/config.md",
}
LINK = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The README without fenced code blocks and inline code, where `[x](y)` is not a link."""
    kept, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(kept)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, (f"README.md has {len(lines)} lines, more than {MAX_LINES}: move the detail into "
                                     "docs/ and link it")


def test_every_relative_link_in_the_readme_exists() -> None:
    text = README.read_text(encoding="utf-8")
    anchors = {_slug(m) for m in re.findall(r"^#+ (.+)$", _prose(text), flags=re.MULTILINE)}
    links = [target for _, target in LINK.findall(_prose(text))]
    assert links, "no links found: the pattern no longer matches the README"
    broken = []
    for target in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...: not a file of the repository
            continue
        path, _, fragment = target.partition("#")
        if not path:
            if fragment not in anchors:
                broken.append(f"{target} (no such heading in README.md)")
            continue
        if path in NOT_YET:
            continue
        if not (ROOT / path).exists():
            broken.append(target)
    assert not broken, f"README.md links to what does not exist: {broken}"
