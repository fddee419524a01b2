"""Build small DSLs in tests and run them.

    dsl = make_dsl(
        node("Switch:Route", "Switch", {...}, downstream=["Message:Yes", "Message:No"]),
        node("Message:Yes", "Message", {"content": ["yes"]}, downstream=[]),
        node("Message:No", "Message", {"content": ["no"]}, downstream=[]),
        variables={"count": {"type": "number", "value": 0}},
    )
    events = run(Canvas(dsl), query="hi")
    assert final(events)["status"] == "succeeded" and answer(events) == "yes"

Nodes given without ``downstream`` are chained in the order given (``begin`` → first
node → second ...); ``upstream`` lists are derived from the downstream links, so a
test only spells out the wiring it is about.
"""

from __future__ import annotations

from typing import Any

from agent.canvas import Canvas

Node = tuple[str, dict]


def node(
    cid: str,
    component_name: str,
    params: dict | None = None,
    *,
    downstream: list[str] | None = None,
    parent_id: str | None = None,
) -> Node:
    """One component entry; ``downstream=None`` means "chain to the next node given"."""
    entry: dict[str, Any] = {"obj": {"component_name": component_name, "params": dict(params or {})}}
    if downstream is not None:
        entry["downstream"] = list(downstream)
    if parent_id is not None:
        entry["parent_id"] = parent_id
    return cid, entry


def make_dsl(
    *nodes: Node,
    begin: dict | None = None,
    variables: dict | None = None,
    globals: dict | None = None,
) -> dict:
    """A DSL with ``begin`` (params ``begin``) followed by ``nodes``.

    Args:
        nodes: from :func:`node`; without ``downstream`` each links to the next one
            (the last one to nothing).
        begin: Begin's params (e.g. ``{"inputs": {...}}``).
        variables: the DSL's conversation variables ``{name: {"type", "value"}}``.
        globals: extra globals (``env.*`` values, say).
    """
    ids = [cid for cid, _ in nodes]
    components: dict[str, dict] = {
        "begin": {"obj": {"component_name": "Begin", "params": dict(begin or {})}, "downstream": ids[:1]}
    }
    for i, (cid, entry) in enumerate(nodes):
        entry = dict(entry)
        entry.setdefault("downstream", ids[i + 1 : i + 2])
        components[cid] = entry
    for entry in components.values():
        entry["upstream"] = []
    for cid, entry in components.items():
        for other in entry["downstream"]:
            if other in components:
                components[other]["upstream"].append(cid)
    dsl: dict[str, Any] = {"components": components, "path": [], "history": [], "retrieval": []}
    if variables is not None:
        dsl["variables"] = variables
    if globals is not None:
        dsl["globals"] = globals
    return dsl


def run(canvas: Canvas, query: str = "", **kwargs: Any) -> list[dict]:
    """All events of one turn."""
    return list(canvas.run(query=query, **kwargs))


def run_dsl(dsl: dict, query: str = "", **kwargs: Any) -> tuple[Canvas, list[dict]]:
    """Load ``dsl`` and run one turn; returns the canvas and the events."""
    canvas = Canvas(dsl)
    return canvas, run(canvas, query, **kwargs)


def final(events: list[dict]) -> dict:
    """The ``data`` of the terminal event (``workflow_finished`` or ``user_inputs``)."""
    assert events, "the run produced no events"
    assert events[-1]["event"] in ("workflow_finished", "user_inputs"), events[-1]["event"]
    return events[-1]["data"]


def answer(events: list[dict]) -> str:
    """The answer text streamed in ``message`` events."""
    return "".join(e["data"]["content"] for e in events if e["event"] == "message")


def finished_nodes(events: list[dict]) -> dict[str, dict]:
    """``node_finished`` data by component id (the last run of each)."""
    return {e["data"]["component_id"]: e["data"] for e in events if e["event"] == "node_finished"}


def ran(events: list[dict]) -> list[str]:
    """The ids of the components that started, in order."""
    return [e["data"]["component_id"] for e in events if e["event"] == "node_started"]


def outputs_of(events: list[dict], cid: str) -> dict:
    """The outputs a component finished with (outputs are cleared at the end of a turn)."""
    nodes = finished_nodes(events)
    assert cid in nodes, f"{cid} did not run; ran: {ran(events)}"
    return nodes[cid]["outputs"]
