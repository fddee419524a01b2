"""Configuration: ``conf/service_conf.yaml`` overridden by the environment.

The file is found from the package (``<project>/conf/service_conf.yaml``), not from
the working directory, or named by ``AGENTCANVAS_CONF``. Any key can be overridden
with ``AGENTCANVAS_<SECTION>_<KEY>`` (``AGENTCANVAS_LIMITS_MAX_STEPS=2000``); values
are parsed as YAML scalars so numbers and booleans keep their types. Both ``agent``
(LLM providers, Invoke) and ``api`` read it through :func:`load_settings`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONF = PROJECT_ROOT / "conf" / "service_conf.yaml"
ENV_PREFIX = "AGENTCANVAS_"


def conf_path() -> Path:
    return Path(os.environ.get("AGENTCANVAS_CONF") or DEFAULT_CONF)


def load_settings(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The merged settings: the YAML file, then ``AGENTCANVAS_*`` variables."""
    env = os.environ if env is None else env
    path = conf_path()
    data: dict[str, Any] = {}
    if path.exists():
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    data = copy.deepcopy(data)
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name == "AGENTCANVAS_CONF":
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        section, _, key = rest.partition("_")
        if not key or not isinstance(data.get(section, {}), dict):
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        if isinstance(value, (dict, list)) and key not in ("allow_hosts", "providers"):
            value = raw
        data.setdefault(section, {})[key] = value
    return data
