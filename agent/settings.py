"""Configuration: ``conf/service_conf.yaml`` overridden by the environment; where data goes.

The file is found from the package, not from the working directory: in a checkout
``<project>/conf/service_conf.yaml``, in an installed wheel the copy it carries
(:func:`resource_dir`); or it is named by ``AGENTCANVAS_CONF``. Data (the SQLite
file, stored files) goes under :func:`data_home`. Any key can be overridden
with ``AGENTCANVAS_<SECTION>_<KEY>`` (``AGENTCANVAS_LIMITS_MAX_STEPS=2000``); values
are parsed as YAML so numbers, booleans and lists keep their types, except for keys
that hold text (see :data:`TEXT_KEYS`). Both ``agent``
(LLM providers, Invoke) and ``api`` read it through :func:`load_settings`.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
#: A source checkout (or an editable install of one), not a wheel in site-packages.
IS_CHECKOUT = (PROJECT_ROOT / "setup.cfg").is_file() and (PROJECT_ROOT / "conf").is_dir()
#: Where a built wheel carries ``conf/`` and ``samples/`` (copied there by setup.py).
BUNDLED = Path(__file__).resolve().parent / "_bundled"
ENV_PREFIX = "AGENTCANVAS_"
# Values that are text whatever they look like (a key "0123", a model "1.5").
TEXT_KEYS = {
    ("llm", "api_key"),
    ("llm", "model"),
    ("llm", "base_url"),
    ("llm", "default_provider"),
    ("database", "url"),
}


def resource_dir(name: str) -> Path:
    """The folder ``conf`` or ``samples``: the checkout's own, or the wheel's copy."""
    return (PROJECT_ROOT if IS_CHECKOUT else BUNDLED) / name


DEFAULT_CONF = resource_dir("conf") / "service_conf.yaml"


def data_home(env: dict[str, str] | None = None) -> Path:
    """Where data goes: ``AGENTCANVAS_HOME``; else ``<project>/data`` in a checkout, else
    the user's data directory (``~/.local/share/agentcanvas`` on Linux). Never inside
    ``site-packages``. Not created here."""
    env = os.environ if env is None else env
    if env.get("AGENTCANVAS_HOME"):
        return Path(env["AGENTCANVAS_HOME"]).expanduser().resolve()
    if IS_CHECKOUT:
        return PROJECT_ROOT / "data"
    import platformdirs

    return Path(platformdirs.user_data_dir("agentcanvas", appauthor=False))


def conf_path(env: dict[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get("AGENTCANVAS_CONF") or DEFAULT_CONF)


def load_settings(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The merged settings: the YAML file, then ``AGENTCANVAS_*`` variables."""
    env = os.environ if env is None else env
    path = conf_path(env)
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
        data.setdefault(section, {})
        data.setdefault(section, {})[key] = _env_value(section, key, raw, data[section].get(key))
    return data


def _env_value(section: str, key: str, raw: str, current: Any) -> Any:
    """An environment value read as YAML (numbers, booleans, lists) unless the key
    holds text: one of :data:`TEXT_KEYS`, or a key the file sets to text."""
    if (section, key) in TEXT_KEYS or isinstance(current, str) or raw == "":
        return raw
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    if isinstance(value, (dict, list)) and not isinstance(current, (dict, list)):
        return raw
    return value
