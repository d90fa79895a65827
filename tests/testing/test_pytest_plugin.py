"""The pytest plugin, as a user's project meets it: `durably_env`, the `durably` marker and
`--durably-store`, run by pytest in a scratch project (a subprocess), and picked up from a
plain `pip install` of durably into a fresh virtualenv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

SCRATCH_TESTS = """
import os

import pytest

import durably
from durably import WorkflowCtx


@durably.workflow("scratch.nap")
async def nap(ctx: WorkflowCtx, _: None) -> str:
    await ctx.sleep("3d")
    return "rested"


@pytest.mark.asyncio
async def test_the_factory_opens_an_environment(durably_env, durably_store):
    env = await durably_env(workflows=[nap])
    began = env.clock.now()
    assert await env.run(nap, None) == "rested"
    assert env.clock.now() - began == 3 * 86_400_000
    assert durably_store == os.environ["EXPECTED_STORE"]
    expected = "InMemoryStateStore" if durably_store == "memory" else "SqlStateStore"
    assert type(env.store).__name__ == expected


@pytest.mark.asyncio
@pytest.mark.durably(store="sqlite", time_skipping=False)
async def test_the_marker_sets_the_defaults(durably_env):
    env = await durably_env(workflows=[nap])
    assert type(env.store).__name__ == "SqlStateStore"
    assert not env.time_skipping
    other = await durably_env(store="memory")  # the call's keywords win
    assert type(other.store).__name__ == "InMemoryStateStore"
"""


def _scratch(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    # A user's project with pytest-asyncio in strict mode (the fixture is pytest-asyncio's).
    (project / "pytest.ini").write_text("[pytest]\nasyncio_mode = strict\n")
    (project / "test_scratch.py").write_text(textwrap.dedent(SCRATCH_TESTS))
    return project


def _pytest(python: str, project: Path, *args: str, store: str, pythonpath: str | None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["EXPECTED_STORE"] = store
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_project_gets_the_fixture_the_marker_and_the_option(tmp_path: Path) -> None:
    # (The default store, memory, is what the fresh install below runs with.)
    project = _scratch(tmp_path)
    done = _pytest(
        sys.executable, project, "--durably-store=sqlite", store="sqlite", pythonpath=str(SRC)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_a_bad_store_option_is_a_usage_error(tmp_path: Path) -> None:
    done = _pytest(
        sys.executable,
        _scratch(tmp_path),
        "--durably-store=mongo",
        store="mongo",
        pythonpath=str(SRC),
    )
    assert done.returncode == 4, done.stdout + done.stderr
    assert "--durably-store='mongo'" in done.stderr


def test_importing_durably_never_imports_pytest() -> None:
    code = (
        "import sys, durably, durably.testing; "
        "assert 'pytest' not in sys.modules, sorted(m for m in sys.modules if 'pytest' in m)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_a_plain_install_registers_the_plugin(tmp_path: Path) -> None:
    """`pip install durably` (this checkout, built as a wheel, no extras) into a fresh
    virtualenv, then `pytest` in a user's project: the plugin comes from the entry point. The
    dependencies are the ones this environment has (a path file points at them), so only the
    build backend may be fetched, once, into pip's cache."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # This environment's packages (pytest, pytest-asyncio, sqlalchemy, …) as a plain path
    # entry: its own .pth files (this checkout's editable install among them) are not run.
    Path(site, "host.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # Built from a copy of what a source distribution holds: a build in the checkout itself
    # would leave its build/ and egg-info folders there.
    source = tmp_path / "durably-src"
    shutil.copytree(SRC, source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    build = subprocess.run(
        [
            sys.executable,  # this environment's pip, installing into the new one
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "-q",
            # The build backend comes from pip's cache (or the index, once); every
            # dependency is already there, through the path file.
            "--disable-pip-version-check",
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    project = _scratch(tmp_path)
    where = subprocess.run(
        [python, "-c", "import durably; print(durably.__file__)"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(site), where  # the installed copy, not this checkout's src
    done = _pytest(python, project, store="memory", pythonpath=None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


@pytest.mark.durably(time_skipping=False)
async def test_this_suite_loads_the_plugin_from_its_conftest(durably_env, durably_store) -> None:
    env = await durably_env()
    assert not env.time_skipping  # the marker's default
    assert durably_store == "memory"
    assert type(env.store).__name__ == "InMemoryStateStore"
