"""The intake form turn as a LangGraph graph: greet → interrupt for the form → reply.

The same three steps as ``samples/intake_form.json``, with the history bounded like
our snapshot's. ``bench/turns.py`` compiles ``builder`` with a SQLite checkpointer;
``bench/http.py`` serves ``graph`` with ``langgraph dev``.
"""

from __future__ import annotations

from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

FORM_FIELDS = ["name", "age", "plan", "notes"]


def bounded(old: list, new: list) -> list:
    return (old + new)[-100:]  # the same bounded history our snapshot keeps


class State(TypedDict, total=False):
    history: Annotated[list, bounded]
    query: str
    form: dict


def greet(state: State) -> dict:
    return {"history": [["user", state["query"]]]}


def ask(state: State) -> dict:
    return {"form": interrupt({"fields": FORM_FIELDS})}


def reply(state: State) -> dict:
    return {"history": [["assistant", f"Thanks {state['form']['name']}"]]}


builder = StateGraph(State)
builder.add_node("greet", greet)
builder.add_node("ask", ask)
builder.add_node("reply", reply)
builder.add_edge(START, "greet")
builder.add_edge("greet", "ask")
builder.add_edge("ask", "reply")
builder.add_edge("reply", END)
graph = builder.compile()
