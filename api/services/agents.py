"""Agents, their versions, drafts and releases, and the bundled templates.

A DSL is accepted only if :class:`agent.canvas.Canvas` loads it; the runtime's
``DSLError`` names the component at fault and is passed on as is. Every change of
the DSL saves a new version; sessions stay on the version they started with.

Drafts and releases, as RAGFlow: the agent's ``dsl`` is the editable draft (its
newest version). ``release: true`` on create or update publishes the version it
saves (or, with no new DSL, the draft as it is); published versions never change,
and the newest one is ``release_version_id``. Which version a new session runs is
:func:`runnable_version`'s choice: the draft, the latest release (``release``), or
the latest release when there is one and else the draft (embed page, OpenAI route).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from peewee import IntegrityError

from agent.canvas import Canvas, Limits
from agent.component.form_base import FormComponent
from agent.component.retrieval import dataset_ids_in
from agent.forms import public_form
from agent.settings import resource_dir
from api import ratelimit
from api.db import Agent, AgentVersion, Dataset, MemoryEntry, Session, date_of, now_ms, write_transaction
from api.db.prepared import Prepared
from api.errors import ArgumentError, Conflict, NotFound, TooLarge
from api.services.files import FileSettings, delete_agent_files, remove_stored_files
from api.services.retention import trash_sessions

ORDER_FIELDS = ("create_time", "update_time", "title")
MAX_TITLE = 255
#: The bundled sample agents: ``agentcanvas quickstart`` loads them, ``GET /agents/templates`` lists them.
SAMPLES_DIR = resource_dir("samples")


def unwrap_export(dsl: Any) -> Any:
    """A RAGFlow export wraps the DSL with its title: take the DSL out."""
    if isinstance(dsl, dict) and "components" not in dsl and isinstance(dsl.get("dsl"), dict):
        return dsl["dsl"]
    return dsl


def check_dsl(dsl: Any, limits: Limits) -> tuple[str, Canvas]:
    """The DSL as JSON text and the loaded canvas.

    Raises:
        ArgumentError: not an object (or JSON text of one).
        TooLarge: over ``limits.max_dsl_bytes``.
        agent.errors.DSLError: the runtime refuses it (the message names the component).
    """
    if isinstance(dsl, str):
        try:
            dsl = json.loads(dsl)
        except ValueError as exc:
            raise ArgumentError(f"'dsl' is text but not valid JSON: {exc}") from None
    dsl = unwrap_export(dsl)
    if not isinstance(dsl, dict):
        raise ArgumentError(f"'dsl' must be a JSON object with 'components', got {type(dsl).__name__}")
    text = json.dumps(dsl, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode("utf-8"))
    if size > limits.max_dsl_bytes:
        raise TooLarge(f"the DSL is {size} bytes; the limit is {limits.max_dsl_bytes} (limits.max_dsl_bytes)")
    return text, Canvas(text, limits=limits)


def check_datasets(tenant_id: str, canvas: Canvas) -> None:
    """Every dataset a Retrieval names (by id or name) must be the tenant's: else 404 naming it."""
    for cid, name in dataset_ids_in(canvas):
        owned = Dataset.select(Dataset.id).where(
            (Dataset.tenant_id == tenant_id) & ((Dataset.id == name) | (Dataset.name == name))
        )
        if not owned.exists():
            raise NotFound(f"{cid}: kb_ids names dataset {name!r}, which is not found")


def check_title(title: Any) -> str:
    if not isinstance(title, str) or not title.strip():
        raise ArgumentError(f"'title' must be non-empty text, got {title!r}")
    title = title.strip()
    if len(title) > MAX_TITLE:
        raise ArgumentError(f"'title' is {len(title)} characters; the limit is {MAX_TITLE}")
    return title


def check_session_ttl(value: Any) -> int | None:
    """An agent's idle-session lifetime: seconds (0: forever) or ``None`` for the server's."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**10:
        raise ArgumentError(
            f"'session_ttl_seconds' must be a whole number of seconds (0: keep forever) or null (the "
            f"server's session.ttl_seconds), got {value!r}"
        )
    return value


def check_description(description: Any) -> str:
    if description is None:
        return ""
    if not isinstance(description, str):
        raise ArgumentError(f"'description' must be text, got {type(description).__name__}")
    return description


def get_agent(tenant_id: str, agent_id: str) -> Agent:
    """The tenant's agent; another tenant's is reported exactly like a missing one."""
    agent = Agent.get_or_none((Agent.id == agent_id) & (Agent.tenant_id == tenant_id))
    if agent is None:
        raise _agent_not_found(agent_id)
    return agent


class AgentLimits(NamedTuple):
    """What :mod:`api.ratelimit` reads of an agent: its id and its own ``rate_limits``."""

    id: str
    rate_limits: str | None


_AGENT_LIMITS = Prepared(
    lambda m: Agent.select(Agent.id, Agent.rate_limits).where(
        (Agent.id == m("id")) & (Agent.tenant_id == m("tenant"))
    )
)


def agent_limits_of(tenant_id: str, agent_id: str) -> AgentLimits:
    """The tenant's agent as a request counted against its rate limits needs it, found or
    refused as :func:`get_agent` does: two columns read by a prepared statement, where
    :func:`get_agent` builds its query and a model of the whole row (the DSL too), which
    was a third of an embed completion's time (0.5 ms of it on SQLite)."""
    row = _AGENT_LIMITS.row(id=agent_id, tenant=tenant_id) if isinstance(agent_id, str) else None
    if row is None:
        raise _agent_not_found(agent_id)
    return AgentLimits(*row)


def _agent_not_found(agent_id: Any) -> NotFound:
    return NotFound(f"agent {agent_id!r} not found")


def _title_taken(tenant_id: str, title: str) -> Conflict:
    return Conflict(f"an agent titled {title!r} already exists; choose another title or update that agent")


def create_agent(
    tenant_id: str, title: Any, dsl: Any, description: Any, limits: Limits, release: bool = False
) -> Agent:
    """A new agent whose first version is its draft, and also its first release if ``release``."""
    title = check_title(title)
    description = check_description(description)
    text, canvas = check_dsl(dsl, limits)
    check_datasets(tenant_id, canvas)
    now = now_ms()
    try:
        with write_transaction():
            if Agent.select().where((Agent.tenant_id == tenant_id) & (Agent.title == title)).exists():
                raise _title_taken(tenant_id, title)
            agent = Agent.create(
                tenant_id=tenant_id,
                title=title,
                description=description,
                dsl=text,
                version_id="",
                create_time=now,
                update_time=now,
            )
            version = AgentVersion.create(
                agent_id=agent.id, number=1, title=title, dsl=text, release=release, create_time=now
            )
            agent.version_id = version.id
            agent.release_version_id = version.id if release else None
            Agent.update(version_id=agent.version_id, release_version_id=agent.release_version_id).where(
                Agent.id == agent.id
            ).execute()
    except IntegrityError:
        raise _title_taken(tenant_id, title) from None
    agent.warnings = list(canvas.warnings)
    return agent


def update_agent(tenant_id: str, agent_id: str, body: dict, limits: Limits, release: bool = False) -> Agent:
    """Change title, description and/or DSL; a new DSL becomes a new version (the draft).

    ``release`` publishes the draft: the new version, or the current draft when no DSL
    is given or it is the draft's own.
    """
    changes: dict[str, Any] = {}
    if body.get("title") is not None:
        changes["title"] = check_title(body["title"])
    if body.get("description") is not None:
        changes["description"] = check_description(body["description"])
    if "rate_limits" in body:
        try:
            own = ratelimit.check_agent_limits(body["rate_limits"])
        except ValueError as exc:
            raise ArgumentError(str(exc)) from None
        changes["rate_limits"] = json.dumps(own) if own else None
    if "session_ttl_seconds" in body:
        changes["session_ttl_seconds"] = check_session_ttl(body["session_ttl_seconds"])
    text, warnings = None, []
    if body.get("dsl") is not None:
        text, canvas = check_dsl(body["dsl"], limits)
        check_datasets(tenant_id, canvas)
        warnings = list(canvas.warnings)
    if not changes and text is None and not release:
        raise ArgumentError(
            "nothing to update: give 'title', 'description', 'dsl', 'rate_limits', "
            "'session_ttl_seconds' and/or 'release': true"
        )
    now = now_ms()
    try:
        with write_transaction():
            agent = get_agent(tenant_id, agent_id)
            title = changes.get("title", agent.title)
            if (
                title != agent.title
                and Agent.select().where((Agent.tenant_id == tenant_id) & (Agent.title == title)).exists()
            ):
                raise _title_taken(tenant_id, title)
            if text is not None and text == agent.dsl and release:
                text = None  # publishing the draft as it is: no new version
            if text is not None:
                last = (
                    AgentVersion.select(AgentVersion.number)
                    .where(AgentVersion.agent_id == agent_id)
                    .order_by(AgentVersion.number.desc())
                    .first()
                )
                version = AgentVersion.create(
                    agent_id=agent_id,
                    number=(last.number if last else 0) + 1,
                    title=title,
                    dsl=text,
                    release=release,
                    create_time=now,
                )
                changes.update(dsl=text, version_id=version.id)
                if release:
                    changes["release_version_id"] = version.id
            elif release:
                AgentVersion.update(release=True).where(AgentVersion.id == agent.version_id).execute()
                changes["release_version_id"] = agent.version_id
            changes["update_time"] = now
            Agent.update(**changes).where(Agent.id == agent_id).execute()
    except IntegrityError:
        raise _title_taken(tenant_id, changes.get("title", "")) from None
    agent = get_agent(tenant_id, agent_id)
    agent.warnings = warnings
    return agent


def delete_agent(tenant_id: str, agent_id: str, files: FileSettings | None = None) -> None:
    """Delete the agent with its versions, sessions, their message logs, its keyed memory
    and the files uploaded for it (from ``files``' directory too when they are kept there)."""
    with write_transaction():
        get_agent(tenant_id, agent_id)
        # Its keyed memory; what it saved into a tenant's Memory (memory_id) stays there.
        MemoryEntry.delete().where(
            (MemoryEntry.agent_id == agent_id) & MemoryEntry.memory_id.is_null()
        ).execute()
        # Its sessions are gone for readers now; their messages go with the next sweep.
        trash_sessions(Session.select(Session.id).where(Session.agent_id == agent_id))
        AgentVersion.delete().where(AgentVersion.agent_id == agent_id).execute()
        forgotten = delete_agent_files(agent_id)
        Agent.delete().where(Agent.id == agent_id).execute()
    remove_stored_files(forgotten, files)


def list_agents(
    tenant_id: str,
    page: int,
    page_size: int,
    orderby: str,
    desc: bool,
    agent_id: str | None = None,
    title: str | None = None,
) -> tuple[list[Agent], int]:
    query = Agent.select().where(Agent.tenant_id == tenant_id)
    if agent_id:
        query = query.where(Agent.id == agent_id)
    if title:
        query = query.where(Agent.title == title)
    total = query.count()
    rows = list(query.order_by(*Agent.listing_order(orderby, desc)).paginate(page, page_size))
    return rows, total


def runnable_version(tenant_id: str, agent_id: str, release: bool | None) -> tuple[Agent, str, str]:
    """``(agent, version id, DSL text)`` a new session of the agent runs.

    ``release``: False, the draft; True, the latest release (:class:`Conflict` if none
    was published); None, the latest release when there is one, else the draft.
    """
    agent = get_agent(tenant_id, agent_id)
    version_id = _pick_version(agent_id, agent.version_id, agent.release_version_id, release)
    if version_id == agent.version_id:  # the draft's DSL is the agent's
        return agent, version_id, agent.dsl
    return agent, version_id, AgentVersion.get_by_id(version_id).dsl


_RUNNABLE = Prepared(
    lambda m: Agent.select(Agent.version_id, Agent.release_version_id).where(
        (Agent.id == m("id")) & (Agent.tenant_id == m("tenant"))
    )
)
_VERSION_DSL = Prepared(lambda m: AgentVersion.select(AgentVersion.dsl).where(AgentVersion.id == m("id")))


def runnable_version_id(tenant_id: str, agent_id: str, release: bool | None) -> str:
    """The id of the version :func:`runnable_version` picks (refused as it refuses), read
    without the agent's row: a version's DSL never changes, so a caller that keeps what
    it made of one (api.services.turns, a new session's state) need not read it again."""
    row = _RUNNABLE.row(id=agent_id, tenant=tenant_id) if isinstance(agent_id, str) else None
    if row is None:
        raise _agent_not_found(agent_id)
    return _pick_version(agent_id, row[0], row[1], release)


def version_dsl(version_id: str) -> str:
    """The DSL text of an agent version (:class:`NotFound` once its agent was deleted)."""
    row = _VERSION_DSL.row(id=version_id)
    if row is None:
        raise NotFound(f"agent version {version_id!r} not found (its agent was deleted)")
    return row[0]


def _pick_version(agent_id: str, draft: str, released: str | None, release: bool | None) -> str:
    if release is False or (release is None and not released):
        return draft
    if not released:
        raise Conflict(
            f"agent {agent_id!r} has no published version; publish one with 'release': true "
            f"on PUT /agents/{agent_id} (or leave out 'release' to run the draft)"
        )
    return released


def templates() -> list[dict]:
    """The bundled samples as RAGFlow's agent templates ``{id, title, description, dsl, ...}``."""
    out = []
    for path in sorted(SAMPLES_DIR.glob("*.json")):
        title, dsl, description = read_agent_file(path)
        out.append(
            {
                "id": path.stem,
                "title": title,
                "description": description,
                "avatar": None,
                "canvas_type": None,
                "canvas_category": "agent_canvas",
                "dsl": dsl,
            }
        )
    return out


def component_form(tenant_id: str, agent_id: str, component_id: str, limits: Limits) -> dict:
    """The form a component of the agent's draft declares (Begin, UserFillUp); ``{}`` for others."""
    canvas = Canvas(get_agent(tenant_id, agent_id).dsl, limits=limits)
    if component_id not in canvas.components:
        raise NotFound(f"component {component_id!r} of agent {agent_id!r} not found")
    component = canvas.component(component_id)
    return public_form(component.form()) if isinstance(component, FormComponent) else {}


def list_versions(tenant_id: str, agent_id: str) -> list[AgentVersion]:
    get_agent(tenant_id, agent_id)
    query = (
        AgentVersion.select(
            AgentVersion.id,
            AgentVersion.number,
            AgentVersion.title,
            AgentVersion.release,
            AgentVersion.create_time,
        )
        .where(AgentVersion.agent_id == agent_id)
        .order_by(AgentVersion.number.desc())
    )
    return list(query)


def get_version(tenant_id: str, agent_id: str, version_id: str) -> AgentVersion:
    get_agent(tenant_id, agent_id)
    version = AgentVersion.get_or_none((AgentVersion.id == version_id) & (AgentVersion.agent_id == agent_id))
    if version is None:
        raise NotFound(f"version {version_id!r} of agent {agent_id!r} not found")
    return version


def agent_json(agent: Agent, with_dsl: bool = True) -> dict:
    """An agent in RAGFlow's shape (``id``, ``title``, ``dsl``, times)."""
    out = {
        "id": agent.id,
        "title": agent.title,
        "description": agent.description,
        "user_id": agent.tenant_id,
        "canvas_category": "agent_canvas",
        "avatar": None,
        "version_id": agent.version_id,
        "session_ttl_seconds": agent.session_ttl_seconds,
        "release_version_id": agent.release_version_id,
        "create_time": agent.create_time,
        "create_date": date_of(agent.create_time),
        "update_time": agent.update_time,
        "update_date": date_of(agent.update_time),
    }
    out["rate_limits"] = ratelimit.agent_limits(agent)
    if with_dsl:
        out["dsl"] = json.loads(agent.dsl)
    # Set by create and update: what the DSL loads with but will fail on if it runs.
    warnings = getattr(agent, "warnings", None)
    if warnings is not None:
        out["warnings"] = warnings
    return out


def version_json(version: AgentVersion, with_dsl: bool = False) -> dict:
    out = {
        "id": version.id,
        "number": version.number,
        "title": version.title,
        "release": bool(version.release),
        "create_time": version.create_time,
        "create_date": date_of(version.create_time),
    }
    if with_dsl:
        out["dsl"] = json.loads(version.dsl)
    return out


def read_agent_file(path: str | Path) -> tuple[str, dict, str]:
    """``(title, dsl, description)`` from a RAGFlow export or a bare DSL file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {str(path)!r}: {exc.strerror}") from None
    except ValueError as exc:
        raise ValueError(f"{str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a JSON object (a DSL or a RAGFlow export)")
    if "components" not in data and isinstance(data.get("dsl"), dict):
        title = _localized(data.get("title")) or path.stem
        return title, data["dsl"], _localized(data.get("description"))
    return path.stem, data, ""


def _localized(text: Any) -> str:
    """RAGFlow's templates give ``title``/``description`` per language: take English."""
    if isinstance(text, dict):
        text = text.get("en") or next(iter(text.values()), "")
    return "" if text is None else str(text)
