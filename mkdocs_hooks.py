"""mkdocs hook: a link from a page to a repository file outside `docs/` becomes plain text.

The maintainers' pages point at files beside the docs (`../benchmarks/results/…jsonl`,
`../tests/…`), which are right when the pages are read in the repository but are not part of
the site. Such a link is rewritten to its text when its target exists in the repository;
a link to something that does not exist is left alone, so `mkdocs build --strict` still
fails on it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<target>\.\./[^)\s#]+)(?:#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    repo = docs_dir.parent
    here = (docs_dir / page.file.src_path).parent

    def rewrite(match: re.Match[str]) -> str:
        target = (here / match["target"]).resolve()
        outside = not target.is_relative_to(docs_dir)
        if outside and target.is_relative_to(repo) and target.exists():
            return match["text"]
        return match[0]

    return _LINK.sub(rewrite, markdown)
