"""Imported first by every script here: the project root on the path, this folder off it.

``bench/http.py`` is named like the standard library's ``http`` package, and a script's
own folder comes first on ``sys.path``: left there, every ``import http`` (Flask,
requests, urllib) would find that script instead.

The code a script measures is the code of the checkout it is in, first on the path of
this process and of those it starts (``agentcanvas serve``, the floor app): before
``PYTHONPATH`` and before the virtual environment's editable install, which may be
another checkout's (a worktree sharing one ``.venv``). To compare two commits, run each
checkout's own script; the first line on stderr names the code measured.
"""

import importlib.util
import os
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:] = [ROOT, *(p for p in sys.path if os.path.abspath(p or os.getcwd()) not in (BENCH, ROOT))]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [ROOT, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT)]
)


def measured_code() -> str:
    """This checkout's folder and commit (``-dirty``: with changes not committed)."""
    try:
        commit = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{ROOT} at {commit or 'an unknown commit'}"


print(f"  measuring the code of {measured_code()}", file=sys.stderr)


def load_bench(name: str):
    """The script bench/<name>.py as the module ``bench_<name>`` (its subjects, client...),
    loaded once, for the scripts that use it: not by putting this folder on the path
    (see above)."""
    module_name = f"bench_{name}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, os.path.join(BENCH, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module
