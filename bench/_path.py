"""Imported first by every script here: the project root on the path, this folder off it.

``bench/http.py`` is named like the standard library's ``http`` package, and a script's
own folder comes first on ``sys.path``: left there, every ``import http`` (Flask,
requests, urllib) would find that script instead.
"""

import os
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != BENCH]
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
