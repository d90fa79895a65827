"""Every code block a page marks `<!-- runnable -->` runs, and exits 0.

Each block runs as a script in a fresh temporary directory holding the page's files (its
`title="NAME.py"` blocks), with `DURABLY_STORE` naming a new SQLite file there — or, for
`<!-- runnable: postgresql -->`, a fresh schema of the test PostgreSQL server. Conventions:
tests/docs/blocks.py and docs/maintainers/docs.md.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import DOCS, Block, page_files, read_blocks, runnable_blocks
from tests.pg_support import fresh_schema, schema_url

BLOCKS = runnable_blocks()
TIMEOUT_S = 60


async def _run(block: Block, where: Path, store: str) -> None:
    for name, code in page_files(read_blocks(block.page)).items():
        target = where / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(code)
    script = where / (block.title or "_block.py")
    script.write_text(block.code)
    env = {
        **os.environ,
        "DURABLY_STORE": store,
        "TMPDIR": str(where),  # default worker ids are held by lock files there
        "PYTHONPATH": str(where),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        cwd=where,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
        pytest.fail(f"{block.label} still running after {TIMEOUT_S} s:\n{out.decode()}")
    assert proc.returncode == 0, f"{block.label} exited {proc.returncode}:\n{out.decode()}"


@pytest.mark.parametrize("block", BLOCKS, ids=[b.label for b in BLOCKS])
async def test_block_runs(block: Block, tmp_path: Path) -> None:
    if block.store == "postgresql":
        async with fresh_schema() as schema:
            await _run(block, tmp_path, schema_url(schema))
    else:
        await _run(block, tmp_path, f"sqlite:///{tmp_path / 'durably.db'}")


def test_the_guide_has_runnable_blocks() -> None:
    pages = {b.page.relative_to(DOCS).as_posix() for b in BLOCKS}
    for page in ("guide/getting-started.md", "guide/web-apps.md", "guide/deploying.md"):
        assert page in pages, f"docs/{page} has no runnable block"


def test_reader_finds_markers_files_and_stores() -> None:
    text = "\n".join(
        [
            "# Page",
            '```python title="app.py"',
            "x = 1",
            "```",
            "<!-- runnable -->",
            "```python",
            "import app",
            "```",
            "<!-- runnable: postgresql -->",
            "",
            "```python",
            "pass",
            "```",
            "<!-- runnable -->",
            "a paragraph in between unmarks",
            "```python",
            "not run",
            "```",
            "!!! note",
            "    ````python",
            "    indented()",
            "    ````",
        ]
    )
    blocks = read_blocks(DOCS / "x.md", text)
    assert [(b.title, b.store, b.code) for b in blocks] == [
        ("app.py", None, "x = 1\n"),
        (None, "sqlite", "import app\n"),
        (None, "postgresql", "pass\n"),
        (None, None, "not run\n"),
        (None, None, "indented()\n"),
    ]
    assert page_files(blocks) == {"app.py": "x = 1\n"}
    with pytest.raises(ValueError, match="unknown runnable store"):
        read_blocks(DOCS / "x.md", "<!-- runnable: oracle -->\n```python\n```\n")
