"""Imported first by every script here: the project root on the path, this folder off it.

``bench/http.py`` is named like the standard library's ``http`` package, and a script's
own folder comes first on ``sys.path``: left there, every ``import http`` (Flask,
requests, urllib) would find that script instead.
"""

import importlib.util
import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != BENCH]
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def load_bench_http():
    """bench/http.py as the module ``bench_http`` (its subjects and client), for the
    scripts that use them: not by putting this folder on the path (see above)."""
    module = sys.modules.get("bench_http")
    if module is None:
        spec = importlib.util.spec_from_file_location("bench_http", os.path.join(BENCH, "http.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["bench_http"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    return module
