"""Which model and provider an ``llm_id`` names, from the ``llm`` settings.

The settings are the ``llm`` section of ``conf/service_conf.yaml`` (overridden from
the environment by :func:`agent.settings.load_settings`), or a dict of the same shape
that the host passes as ``canvas.services["llm_settings"]``::

    default_provider: openai          # optional; else the environment's, else the first
    providers:
      - name: openai
        base_url: https://api.openai.com/v1
        api_key_env: OPENAI_API_KEY   # the key is read from this variable, never stored
        models: [{name: gpt-4o-mini, context_size: 128000}]
        timeout_seconds: 60           # optional per provider; else the llm section's
        vision: true                  # optional: its models take images (a model entry may say too)
    # The environment alone can define a provider, named "default":
    base_url: ...                     # AGENTCANVAS_LLM_BASE_URL
    api_key: ...                      # AGENTCANVAS_LLM_API_KEY
    model: ...                        # AGENTCANVAS_LLM_MODEL
    context_size: ...                 # AGENTCANVAS_LLM_CONTEXT_SIZE (optional)
    vision: ...                       # AGENTCANVAS_LLM_VISION=1: the model takes images
    # Calls (section-wide; a provider may override each):
    timeout_seconds: 60               # per request; a stream may pause this long between chunks
    max_retries: 2                    # retries on HTTP 429 and 5xx
    retry_backoff_seconds: 0.5        # first wait; doubles each retry (a Retry-After header wins)
    retry_max_backoff_seconds: 8

An ``llm_id`` is ``model@provider`` as in RAGFlow. An empty one uses the default
provider's default model (``model``, else its first listed model). A provider this
installation does not configure is replaced by the default provider *and its default
model*: the model named for a provider we do not have is unlikely to exist on ours.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.errors import LLMConfigError

ENV_PROVIDER = "default"
DEFAULTS = {
    "timeout_seconds": 60.0,
    "max_retries": 2,
    "retry_backoff_seconds": 0.5,
    "retry_max_backoff_seconds": 8.0,
}
_SETUP_HINT = (
    "set AGENTCANVAS_LLM_BASE_URL, AGENTCANVAS_LLM_MODEL and AGENTCANVAS_LLM_API_KEY, or add a provider "
    "under llm.providers in conf/service_conf.yaml"
)


@dataclass(frozen=True)
class ModelConfig:
    """One resolved model: where to send requests and how.

    The API key is kept out of ``repr`` so that it never lands in a log line or an
    error message by accident.
    """

    provider: str
    model: str
    base_url: str
    api_key: str = field(repr=False)
    context_size: int | None = None
    vision: bool = False
    timeout_seconds: float = DEFAULTS["timeout_seconds"]
    max_retries: int = DEFAULTS["max_retries"]
    retry_backoff_seconds: float = DEFAULTS["retry_backoff_seconds"]
    retry_max_backoff_seconds: float = DEFAULTS["retry_max_backoff_seconds"]

    @property
    def llm_id(self) -> str:
        return f"{self.model}@{self.provider}"


def split_llm_id(llm_id: str) -> tuple[str, str]:
    """``"model@provider"`` → ``(model, provider)``; either part may be empty."""
    text = (llm_id or "").strip()
    if "@" not in text:
        return text, ""
    model, provider = text.rsplit("@", 1)
    return model.strip(), provider.strip()


def resolve_model(
    llm_id: str, settings: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> ModelConfig:
    """The model an ``llm_id`` names (see the module docstring).

    Args:
        llm_id: ``model@provider``, ``model``, or empty.
        settings: the ``llm`` settings section.
        environ: where ``api_key_env`` variables are read (``os.environ``).

    Raises:
        LLMConfigError: nothing is configured, or the configuration is incomplete;
            the message names the setting to add.
    """
    settings = settings or {}
    environ = os.environ if environ is None else environ
    providers = _providers(settings)
    model, provider_name = split_llm_id(llm_id)
    provider = providers.get(provider_name) if provider_name else None
    if provider is None:
        provider = _default_provider(settings, providers)
        if provider_name:
            model = ""  # another installation's provider: use ours, with its model
    if not model:
        model = _default_model(provider)
    return _model_config(provider, model, settings, environ)


def _providers(settings: Mapping[str, Any]) -> dict[str, dict]:
    listed = settings.get("providers") or []
    if not isinstance(listed, list):
        raise LLMConfigError("llm.providers must be a list of {name, base_url, api_key_env, models}")
    out: dict[str, dict] = {}
    for i, p in enumerate(listed):
        if not isinstance(p, dict) or not p.get("name") or not p.get("base_url"):
            raise LLMConfigError(f"llm.providers[{i}] needs at least 'name' and 'base_url', got {p!r}")
        if "api_key" in p:
            raise LLMConfigError(
                f"llm.providers[{i}] ({p['name']!r}) holds an api_key: keep keys out of configuration "
                f"files; put it in an environment variable and name that with api_key_env"
            )
        out[str(p["name"])] = p
    if settings.get("base_url"):
        out[ENV_PROVIDER] = {
            "name": ENV_PROVIDER,
            "base_url": settings["base_url"],
            "model": settings.get("model") or "",
            "models": (
                [{"name": settings["model"], "context_size": settings.get("context_size")}]
                if settings.get("model")
                else []
            ),
            "_api_key": _env_api_key(settings),
            "vision": settings.get("vision") or False,
        }
    return out


def _env_api_key(settings: Mapping[str, Any]) -> str:
    key = settings.get("api_key")
    if key is not None and not isinstance(key, str):
        # load_settings() reads values as YAML scalars: a key such as "0123" would have
        # become the number 123. Take the variable's text as it is.
        key = os.environ.get("AGENTCANVAS_LLM_API_KEY", str(key))
    return key or ""


def _default_provider(settings: Mapping[str, Any], providers: dict[str, dict]) -> dict:
    name = settings.get("default_provider") or ""
    if name:
        if name not in providers:
            raise LLMConfigError(
                f"llm.default_provider names {name!r}, which is not among the configured providers "
                f"({', '.join(map(repr, providers)) or 'none'}); add it under llm.providers or fix the name"
            )
        return providers[name]
    if ENV_PROVIDER in providers and settings.get("base_url"):
        return providers[ENV_PROVIDER]
    if providers:
        return next(iter(providers.values()))
    raise LLMConfigError(f"no LLM provider is configured: {_SETUP_HINT}")


def _default_model(provider: dict) -> str:
    if provider.get("model"):
        return str(provider["model"])
    models = provider.get("models") or []
    if models and isinstance(models[0], dict) and models[0].get("name"):
        return str(models[0]["name"])
    if provider["name"] == ENV_PROVIDER:
        raise LLMConfigError("no model is configured for the LLM provider: set AGENTCANVAS_LLM_MODEL")
    raise LLMConfigError(
        f"LLM provider {provider['name']!r} lists no models and the node names none: add "
        f"models: [{{name: ...}}] to it in llm.providers, or set llm_id to 'model@{provider['name']}'"
    )


def _context_size(provider: dict, model: str) -> int | None:
    for m in provider.get("models") or []:
        if isinstance(m, dict) and m.get("name") == model and m.get("context_size"):
            try:
                return int(m["context_size"])
            except (TypeError, ValueError):
                raise LLMConfigError(
                    f"context_size of model {model!r} of LLM provider {provider['name']!r} must be a "
                    f"whole number, got {m['context_size']!r}"
                ) from None
    return None


def _vision(provider: dict, model: str) -> bool:
    """Whether the model takes images: its own entry's ``vision``, else the provider's."""
    for m in provider.get("models") or []:
        if isinstance(m, dict) and m.get("name") == model and "vision" in m:
            return _truthy(m["vision"])
    return _truthy(provider.get("vision"))


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _api_key(provider: dict, environ: Mapping[str, str]) -> str:
    if "_api_key" in provider:
        return str(provider["_api_key"])
    var = provider.get("api_key_env")
    if not var:
        return ""
    key = environ.get(str(var))
    if not key:
        raise LLMConfigError(
            f"LLM provider {provider['name']!r} reads its API key from the environment variable "
            f"{var!r}, which is not set; set it (or remove api_key_env for a server that needs no key)"
        )
    return key


def _number(name: str, provider: dict, settings: Mapping[str, Any], kind: type) -> Any:
    raw = provider.get(name, settings.get(name, DEFAULTS[name]))
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        raise LLMConfigError(f"llm.{name} must be a number, got {raw!r}") from None
    if value < 0:
        raise LLMConfigError(f"llm.{name} must be ≥ 0, got {raw!r}")
    return value


def _model_config(
    provider: dict, model: str, settings: Mapping[str, Any], environ: Mapping[str, str]
) -> ModelConfig:
    return ModelConfig(
        provider=str(provider["name"]),
        model=model,
        base_url=str(provider["base_url"]),
        api_key=_api_key(provider, environ),
        context_size=_context_size(provider, model),
        vision=_vision(provider, model),
        timeout_seconds=_number("timeout_seconds", provider, settings, float),
        max_retries=_number("max_retries", provider, settings, int),
        retry_backoff_seconds=_number("retry_backoff_seconds", provider, settings, float),
        retry_max_backoff_seconds=_number("retry_max_backoff_seconds", provider, settings, float),
    )
