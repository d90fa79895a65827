"""The code blocks of the guide's pages, as the tests under tests/docs read them.

The convention (written up for maintainers in docs/maintainers/docs.md):

- A fenced block whose info string carries `title="NAME.py"` is a **file** of its page: the
  page's runnable blocks run in a directory that holds every such file of the page (so a
  runnable block can `import shop` when the page shows `shop.py`).
- A fenced block right after the comment `<!-- runnable -->` is **run**: as a script, in a
  fresh temporary directory, with `DURABLY_STORE` naming a new SQLite file there.
  `<!-- runnable: postgresql -->` gives it a fresh PostgreSQL schema instead.
- Each runnable block stands alone (apart from the page's files): nothing carries over from
  one block to the next, so each can be copied out of the page and run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARKER = re.compile(r"^\s*<!--\s*runnable(?:\s*:\s*(?P<store>[\w-]+))?\s*-->\s*$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')
STORES = ("sqlite", "postgresql")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    title: str | None
    code: str
    store: str | None  # None: not runnable; else "sqlite" or "postgresql"

    @property
    def label(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"


def read_blocks(page: Path, text: str | None = None) -> list[Block]:
    """Every fenced block of `page`, in order."""
    lines = (page.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    marker: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        found = _MARKER.match(line)
        if found:
            store = found["store"] or "sqlite"
            if store not in STORES:
                raise ValueError(f"{page}:{i + 1}: unknown runnable store {store!r}")
            marker = store
            i += 1
            continue
        opened = _FENCE.match(line)
        if not opened:
            if line.strip():
                marker = None  # the marker must come right before its block
            i += 1
            continue
        indent, fence, info = opened["indent"], opened["fence"], opened["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = lines[j].strip()
            if closing.startswith(fence) and not closing.strip(fence[0]):
                break
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        else:
            raise ValueError(f"{page}:{i + 1}: code block never closed")
        title = _TITLE.search(info)
        language = info.split()[0].lstrip("{.") if info else ""
        blocks.append(
            Block(
                page=page,
                line=i + 1,
                language=language,
                title=title["title"] if title else None,
                code="\n".join(body) + "\n",
                store=marker,
            )
        )
        marker = None
        i = j + 1
    return blocks


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def page_files(blocks: list[Block]) -> dict[str, str]:
    """The page's files: titled blocks, by title (a title used twice must hold one text)."""
    files: dict[str, str] = {}
    for block in blocks:
        if block.title is None:
            continue
        if files.get(block.title, block.code) != block.code:
            raise ValueError(f"{block.label}: {block.title} is shown twice with different code")
        files[block.title] = block.code
    return files


def runnable_blocks() -> list[Block]:
    found = [b for page in pages() for b in read_blocks(page) if b.store is not None]
    for block in found:
        if block.language != "python":
            raise ValueError(f"{block.label}: only python blocks can be marked runnable")
    return found


def commands(blocks: list[Block], program: str) -> list[str]:
    """The `$ PROGRAM …` lines of the page's console blocks, without the prompt and without a
    trailing `# comment`."""
    found = []
    for block in blocks:
        if block.language not in ("console", "shell", "bash", "sh"):
            continue
        for line in block.code.splitlines():
            if line.startswith(f"$ {program} "):
                found.append(line[2:].split("  #")[0].split(" #")[0].strip())
    return found
