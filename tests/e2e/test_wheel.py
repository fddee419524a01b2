"""The built wheel is complete: installed in a fresh virtual environment, ``agentcanvas
quickstart`` gives the first run ``make run`` gives, and writes nothing into site-packages.

``python -m build`` makes the sdist and, from it, the wheel (so the sdist is checked
too), from a copy of the checkout: the build writes into the tree it builds (the sdist's
release folder, ``build/``, ``*.egg-info``), and two test processes building the same
checkout at once (``pytest -n 2`` shares this module's tests out) lost each other's
files ("No such file or directory: 'agentcanvas-0.1.0/api/...'"). The fresh environment
gets only the wheel; the dependencies are borrowed from this test's environment through
a ``.pth`` line (installing them from the network would take minutes and tell nothing
about our package). That environment's editable install of the checkout is not visible
there: ``.pth`` files of a borrowed folder are not run.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import requests

from tests.api.conftest import ROOT
from tests.e2e.conftest import AGENTCANVAS, ServerProcess

# Building, installing and running the wheel are bounded at up to 14 minutes together.
pytestmark = pytest.mark.timeout(1200)

SAMPLES = sorted(p.stem for p in (ROOT / "samples").glob("*.json"))

#: What .gitignore leaves out, so left out of the copy that is built: at the top of the
#: checkout, and anywhere in it.
_NOT_AT_TOP = {".git", ".venv", "data", "build", "dist", ".pytest_cache", ".ruff_cache", ".hypothesis"}
_NOT_ANYWHERE = (
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    "*.db",
    "*.db-wal",
    "*.db-shm",
    "*.db-writer",
    ".state*.json",
)


def _left_out(folder: str, names: list[str]) -> set[str]:
    top = Path(folder) == ROOT
    artifacts = Path(folder) == ROOT / "tests"
    return {
        name
        for name in names
        if (top and name in _NOT_AT_TOP)
        or (artifacts and name == "artifacts")
        or any(fnmatch.fnmatch(name, pattern) for pattern in _NOT_ANYWHERE)
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment holding the built wheel; its ``bin`` folder."""
    base = tmp_path_factory.mktemp("wheel")
    dist = base / "dist"
    source = base / "source"
    shutil.copytree(ROOT, source, ignore=_left_out, symlinks=True)
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheel = next(dist.glob("agentcanvas-*.whl"))
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "borrowed_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTCANVAS_", "XDG_"))}
    env["HOME"] = str(home)
    return env


def _quickstart(program: Path, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        [str(program), "quickstart", "--no-serve"],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _agents(output: str) -> list[str]:
    return re.findall(r"^agent '(.*)':$", output, flags=re.M)


def test_wheel_quickstart_is_the_first_run_of_make_run(installed, tmp_path):
    home = tmp_path / "home"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env(home)

    wheel_run = _quickstart(installed / "agentcanvas", env, elsewhere)
    # What `make run` does in the checkout (kept out of the checkout's ./data here).
    checkout_run = _quickstart(
        AGENTCANVAS, {**env, "AGENTCANVAS_HOME": str(tmp_path / "checkout")}, elsewhere
    )

    assert _agents(wheel_run) == _agents(checkout_run)
    assert len(_agents(wheel_run)) == len(SAMPLES) > 0
    assert "skipped sample" not in wheel_run
    # The data went to the user's data directory, never into the package.
    database = home / ".local" / "share" / "agentcanvas" / "agentcanvas.db"
    assert database.is_file()
    site = installed.parent / "lib"
    assert not [p for p in site.rglob("*.db")], "the installed package wrote a database into site-packages"
    assert list(elsewhere.iterdir()) == []

    # And the server it starts answers a turn of a sample, as `make run`'s does.
    server = ServerProcess(
        env,
        elsewhere,
        tmp_path / "quickstart.log",
        1,
        4,
        command=(str(installed / "agentcanvas"), "quickstart"),
    )
    try:
        server.start()
        log = server.log()
        token = re.findall(r"API token .*: (\S+)$", log, flags=re.M)[-1]
        agent_id = re.search(
            r"agent 'Greeting':\n  completions: POST \S+/agents/(\w+)/completions", log
        ).group(1)
        reply = requests.post(
            f"{server.url}/api/v1/agents/{agent_id}/completions",
            headers={"Authorization": f"Bearer {token}"},
            json={"question": "hello", "stream": False},
            timeout=60,
        )
        assert reply.status_code == 200, reply.text
        assert "hello" in reply.json()["data"]["data"]["content"]
    finally:
        server.stop()


def test_home_puts_the_data_where_it_says(installed, tmp_path):
    env = {**_env(tmp_path / "home"), "AGENTCANVAS_HOME": str(tmp_path / "chosen")}
    _quickstart(installed / "agentcanvas", env, tmp_path)
    assert (tmp_path / "chosen" / "agentcanvas.db").is_file()
    assert not (tmp_path / "home").exists()
