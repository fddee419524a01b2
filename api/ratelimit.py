"""Rate limits: per embed token and visitor, per webhook, per API token.

One call per request, before any work::

    from api import ratelimit
    ratelimit.hit("webhook", agent.id, agent)   # raises RateLimited: HTTP 429 + Retry-After

``scope`` is ``embed``, ``webhook`` or ``api``; ``key`` says who is counted (the
embed route passes its token id and the visitor's ``user_id``, the webhook its agent
id, the API its token's hash); ``agent`` (optional) may carry its own limits.

**Limits** are written as the ``limits`` library reads them, several separated by
``;``: ``"10/second;300/hour"``. The defaults come from ``AGENTCANVAS_RATE_LIMIT_EMBED``,
``AGENTCANVAS_RATE_LIMIT_WEBHOOK`` and ``AGENTCANVAS_RATE_LIMIT_API`` (``rate`` section
of ``service_conf.yaml``: ``limit_embed``, ...); empty means no limit. An agent's
``rate_limits`` (``PUT /agents/<id>`` with ``{"rate_limits": {"embed": "5/second"}}``)
replaces the default for its embed and webhook routes.

**Counts** are fixed windows shared by every worker of every server: in the
database (table ``rate_limit_counter``, :class:`DatabaseStorage`) or, when
``AGENTCANVAS_RATE_LIMIT_STORAGE`` is a ``redis://`` URL, in Redis. A scope without a
limit costs nothing.
"""

from __future__ import annotations

import functools
import json
import math
import random
import time
from typing import Any

from flask import current_app
from limits import RateLimitItem, parse_many
from limits.storage import Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter
from peewee import Case, IntegrityError, PeeweeException

from api.db import RateLimitCounter, db, now_ms, write_transaction
from api.db.database import run_retrying
from api.errors import RateLimited
from api.telemetry import metrics

SCOPES = ("embed", "webhook", "api")


@functools.lru_cache(maxsize=256)
def parse_limits(text: str) -> tuple[RateLimitItem, ...]:
    """``"10/second;300/hour"`` as ``limits`` items; empty text is no limit.

    Raises:
        ValueError: the text is not in that notation (the message shows it).
    """
    text = (text or "").strip()
    if not text:
        return ()
    try:
        return tuple(parse_many(text))
    except ValueError:
        raise ValueError(
            f"rate limit {text!r} is not in the notation '10/second;300/hour' "
            f"(amount/unit, units second, minute, hour, day; several separated by ';')"
        ) from None


def check_agent_limits(value: Any) -> dict[str, str] | None:
    """An agent's ``rate_limits`` checked: ``{scope: notation}`` (``None`` clears them).

    Raises:
        ValueError: not a mapping of known scopes to the notation.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f'\'rate_limits\' must be an object like {{"embed": "10/second"}}, got {value!r}')
    out = {}
    for scope, text in value.items():
        if scope not in ("embed", "webhook"):
            raise ValueError(f"'rate_limits' scope {scope!r} is not embed or webhook")
        if not isinstance(text, str):
            raise ValueError(f"'rate_limits.{scope}' must be text like '10/second;300/hour', got {text!r}")
        parse_limits(text)
        out[scope] = text.strip()
    return out


class DatabaseStorage(Storage):
    """Fixed-window counters in the ``rate_limit_counter`` table, shared by every worker.

    One row per (limit, identifiers): its count and when its window ends (epoch ms).
    A count is bumped by one conditional ``UPDATE`` that restarts an expired window;
    the first hit inserts the row. Plain SQL that every supported engine accepts.
    """

    STORAGE_SCHEME = None

    def __init__(self) -> None:
        super().__init__(wrap_exceptions=False)

    @property
    def base_exceptions(self) -> type[Exception]:
        return PeeweeException

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        # Two workers bumping one counter on two Galera nodes conflict (1213): run_retrying
        # runs the whole bump again, as a deadlock on one server would need too.
        return run_retrying(functools.partial(self._bump, key, expiry, amount))

    def _bump(self, key: str, expiry: int, amount: int) -> int:
        for _ in range(3):
            now = now_ms()
            with write_transaction():
                expired = RateLimitCounter.expires_at <= now
                hit = (
                    RateLimitCounter.update(
                        count=_restart_or_add(expired, amount),
                        expires_at=_restart_or_keep(expired, now + int(expiry * 1000)),
                    )
                    .where(RateLimitCounter.key == key)
                    .execute()
                )
                if hit:
                    row = RateLimitCounter.get(RateLimitCounter.key == key)
                    return int(row.count)
            try:
                with write_transaction():
                    RateLimitCounter.insert(
                        key=key, count=amount, expires_at=now + int(expiry * 1000)
                    ).execute()
                    if random.random() < 1 / 64:  # now and then, forget windows long over
                        RateLimitCounter.delete().where(
                            RateLimitCounter.expires_at < now - 3_600_000
                        ).execute()
                return amount
            except IntegrityError:
                continue  # another worker inserted it first: bump that row
        raise PeeweeException(f"rate limit counter {key!r} could not be updated")

    def get(self, key: str) -> int:
        with db.connection_context():
            row = RateLimitCounter.get_or_none(RateLimitCounter.key == key)
        if row is None or row.expires_at <= now_ms():
            return 0
        return int(row.count)

    def get_expiry(self, key: str) -> float:
        with db.connection_context():
            row = RateLimitCounter.get_or_none(RateLimitCounter.key == key)
        return (row.expires_at / 1000.0) if row is not None else time.time()

    def check(self) -> bool:
        return True

    def reset(self) -> int | None:
        with db.connection_context():
            return RateLimitCounter.delete().execute()

    def clear(self, key: str) -> None:
        with db.connection_context():
            RateLimitCounter.delete().where(RateLimitCounter.key == key).execute()


def _restart_or_add(expired: Any, amount: int) -> Any:
    return Case(None, ((expired, amount),), RateLimitCounter.count + amount)


def _restart_or_keep(expired: Any, new_end: int) -> Any:
    return Case(None, ((expired, new_end),), RateLimitCounter.expires_at)


class Limiter:
    """The app's rate limiter (``create_app`` makes one from the settings).

    Args:
        defaults: ``{scope: notation}``, empty notation meaning no limit.
        storage_url: ``redis://...`` for Redis, empty for the database.
    """

    def __init__(self, defaults: dict[str, str], storage_url: str = ""):
        for scope in SCOPES:
            try:
                parse_limits(defaults.get(scope) or "")
            except ValueError as exc:
                raise ValueError(f"setting AGENTCANVAS_RATE_LIMIT_{scope.upper()}: {exc}") from None
        self.defaults = {scope: (defaults.get(scope) or "").strip() for scope in SCOPES}
        self.storage_url = storage_url or ""
        self._strategy: FixedWindowRateLimiter | None = None

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> Limiter:
        rate = settings.get("rate") or {}
        return cls(
            {scope: str(rate.get(f"limit_{scope}") or "") for scope in SCOPES},
            str(rate.get("limit_storage") or ""),
        )

    def strategy(self) -> FixedWindowRateLimiter:
        if self._strategy is None:
            if self.storage_url:
                storage = storage_from_string(self.storage_url)
            else:
                storage = DatabaseStorage()
            self._strategy = FixedWindowRateLimiter(storage)
        return self._strategy

    def limits_for(self, scope: str, agent: Any = None) -> tuple[RateLimitItem, ...]:
        own = agent_limits(agent).get(scope) if agent is not None else None
        return parse_limits(own if own is not None else self.defaults[scope])

    def hit(self, scope: str, key: str, agent: Any = None) -> None:
        """Count one request of ``key`` in ``scope``.

        Raises:
            RateLimited: over one of the limits (nothing else is done for the request).
        """
        if scope not in SCOPES:
            raise ValueError(f"rate limit scope {scope!r} is not one of {', '.join(SCOPES)}")
        items = self.limits_for(scope, agent)
        if not items:
            return
        strategy = self.strategy()
        for item in items:
            if not strategy.hit(item, "agentcanvas", scope, key):
                reset = strategy.get_window_stats(item, "agentcanvas", scope, key).reset_time
                retry = max(1, math.ceil(reset - time.time()))
                metrics().rate_limited.labels(scope).inc()
                raise RateLimited(
                    f"too many requests: the {scope} limit is {item} "
                    f"({_setting(scope, agent)}); retry in {retry} s",
                    retry_after=retry,
                )


def agent_limits(agent: Any) -> dict[str, str]:
    """The agent's own ``rate_limits`` (``{}`` when it has none)."""
    text = getattr(agent, "rate_limits", None)
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _setting(scope: str, agent: Any) -> str:
    if agent is not None and scope in agent_limits(agent):
        return "the agent's rate_limits"
    return f"AGENTCANVAS_RATE_LIMIT_{scope.upper()}"


def limited(scope: str, agent: Any = None) -> bool:
    """Whether ``scope`` has a limit on the current app (for ``agent``): else :func:`hit`
    does nothing, and the caller need not work out its key."""
    limiter = current_app._get_current_object().extensions["agentcanvas.ratelimit"]  # type: ignore[attr-defined]
    return bool(limiter.limits_for(scope, agent))


def hit(scope: str, key: str, agent: Any = None) -> None:
    """:meth:`Limiter.hit` on the current app's limiter (see the module docstring)."""
    current_app.extensions["agentcanvas.ratelimit"].hit(scope, key, agent)
