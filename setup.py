"""Build hook: a wheel carries ``conf/`` and ``samples/`` inside the ``agent`` package.

In a checkout they stay at the top (``make run``, the README and the tests use them
there); a built wheel gets a copy under ``agent/_bundled/`` so that an installed
``agentcanvas`` finds its defaults and samples (``agent.settings.resource_dir``).
Everything else is in ``setup.cfg``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUNDLED = ("conf", "samples")


class BuildWithResources(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's own folders
        for name in BUNDLED:
            target = Path(self.build_lib) / "agent" / "_bundled" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(ROOT / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildWithResources})
