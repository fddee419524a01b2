"""Tenants and bearer tokens.

A token is shown once, when it is made; the database keeps its sha256 and a short
hint. ``api`` tokens authorise the REST API; ``embed`` tokens only the embed routes
(a token of one kind never works for the other).
"""

from __future__ import annotations

import hashlib
import mmap
import re
import secrets
import struct
import threading
import time

from peewee import IntegrityError

from api.db import ApiToken, Tenant, write_transaction
from api.db.prepared import Prepared
from api.errors import ArgumentError, NotFound

TOKEN_KINDS = ("api", "embed")
_PREFIX = {"api": "ac-", "embed": "acembed-"}
DEFAULT_TENANT = "default"  # the tenant the CLI uses when none is named


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def tenant_by_name(name: str, create: bool = True) -> Tenant:
    """The tenant called ``name``, made if missing (and ``create``)."""
    if not isinstance(name, str) or not name.strip() or len(name) > 128:
        raise ArgumentError(f"tenant name must be 1 to 128 characters, got {name!r}")
    name = name.strip()
    tenant = Tenant.get_or_none(Tenant.name == name)
    if tenant is not None or not create:
        if tenant is None:
            raise NotFound(f"no tenant named {name!r}")
        return tenant
    try:
        return Tenant.create(name=name)
    except IntegrityError:
        # Made by a concurrent command between our read and our insert.
        return Tenant.get(Tenant.name == name)


def create_token(tenant_id: str, kind: str = "api") -> tuple[str, ApiToken]:
    """A new token for the tenant: ``(plain token, row)``."""
    if kind not in TOKEN_KINDS:
        raise ArgumentError(f"token kind {kind!r} is not one of {', '.join(TOKEN_KINDS)}")
    plain = _PREFIX[kind] + secrets.token_urlsafe(32)
    row = ApiToken.create(
        tenant_id=tenant_id, kind=kind, token_hash=hash_token(plain), hint=plain[: len(_PREFIX[kind]) + 6]
    )
    return plain, row


#: How long a worker trusts a token it has looked up. A revocation made through this
#: server reaches all its workers at once (see ``_Revocations``); one made elsewhere
#: (the CLI, another machine) within this time.
TOKEN_CACHE_SECONDS = 0.5
_TOKEN_CACHE_MAX = 4096


class _Revocations:
    """A counter shared by the processes forked from this one (gunicorn's workers).

    Revoking a token bumps it; a worker that sees it move forgets every token it
    remembered. An anonymous shared mapping made at import, before the fork.
    """

    def __init__(self) -> None:
        self._map = mmap.mmap(-1, 8)

    def count(self) -> int:
        return struct.unpack_from("Q", self._map)[0]

    def bump(self) -> None:
        struct.pack_into("Q", self._map, 0, self.count() + 1)


_REVOCATIONS = _Revocations()
# Keyed by the token as sent, so a remembered token is not hashed again (sha256 through
# OpenSSL cost 15-25 us a request once a turn had run between two requests).
_TOKEN_CACHE: dict[tuple[str, str], tuple[str, float]] = {}
_TOKEN_CACHE_LOCK = threading.Lock()
_TOKEN_CACHE_SEEN = [_REVOCATIONS.count()]
_FIND_TOKEN = Prepared(
    lambda m: ApiToken.select(ApiToken.tenant_id).where(
        (ApiToken.token_hash == m("hash")) & (ApiToken.kind == m("kind"))
    )
)


def tenant_for_token(plain: str, kind: str = "api") -> str | None:
    """The tenant id a token of ``kind`` belongs to, or ``None``.

    A found token is remembered for :data:`TOKEN_CACHE_SECONDS` (per process), so a
    busy worker reads it once per interval instead of once per request.
    """
    key = (plain, kind)
    now = time.monotonic()
    revoked = _REVOCATIONS.count()
    with _TOKEN_CACHE_LOCK:
        if revoked != _TOKEN_CACHE_SEEN[0]:
            _TOKEN_CACHE.clear()
            _TOKEN_CACHE_SEEN[0] = revoked
        hit = _TOKEN_CACHE.get(key)
    if hit is not None and hit[1] > now:
        return hit[0]
    row = _FIND_TOKEN.row(hash=hash_token(plain), kind=kind)
    if row is None:
        return None
    with _TOKEN_CACHE_LOCK:
        if len(_TOKEN_CACHE) >= _TOKEN_CACHE_MAX:
            _TOKEN_CACHE.clear()
        if _TOKEN_CACHE_SEEN[0] == revoked:  # not if a revocation came in meanwhile
            _TOKEN_CACHE[key] = (row[0], now + TOKEN_CACHE_SECONDS)
    return row[0]


def list_tokens(tenant_id: str | None = None) -> list[ApiToken]:
    query = ApiToken.select().order_by(ApiToken.create_time, ApiToken.id)
    if tenant_id is not None:
        query = query.where(ApiToken.tenant_id == tenant_id)
    return list(query)


#: How a token is named by its hash (``sha256:<hex>``): what logs see of a plain token.
HASHED = "sha256:"
_TOKEN_ID = re.compile(r"[0-9a-f]{32}")


def is_token_id(text: str) -> bool:
    """Whether ``text`` is a token's id (as a token list shows it), not a token."""
    return bool(_TOKEN_ID.fullmatch(text))


def hashed_name(token: str) -> str:
    """``sha256:<hex>``: a plain token named without showing it (for URLs that get logged)."""
    return HASHED + hash_token(token)


def revoke_token(token_or_id: str, tenant_id: str | None = None) -> ApiToken:
    """Delete a token given as its id (from a list), as ``sha256:<hash>``, or as itself.

    Raises:
        NotFound: no such token (for this tenant, when one is given).
    """
    if token_or_id.startswith(HASHED):
        cond = ApiToken.token_hash == token_or_id[len(HASHED) :]
    else:
        cond = (ApiToken.token_hash == hash_token(token_or_id)) | (ApiToken.id == token_or_id)
    if tenant_id is not None:
        cond &= ApiToken.tenant_id == tenant_id
    with write_transaction():
        row = ApiToken.select().where(cond).first()
        if row is None:
            raise NotFound("no such token; give the token itself or its id from the token list")
        row.delete_instance()
    _REVOCATIONS.bump()  # after the commit: a worker that looks again must not find it
    return row


def token_json(row: ApiToken, plain: str | None = None) -> dict:
    """A token as the API shows it; the plain token only right after creation."""
    out = {
        "id": row.id,
        "tenant_id": row.tenant_id,
        "kind": row.kind,
        "token": plain if plain is not None else f"{row.hint}…",
        "create_time": row.create_time,
    }
    if plain is None:
        out["hint"] = row.hint
    return out
