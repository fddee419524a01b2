"""The API description: OpenAPI 3.1 at ``/api/v1/openapi.json``, made from the same
request schemas that validate requests (spectree over pydantic models).

A route declares its request once, with :data:`spec`::

    class CreateThing(Body):                 # Body: extra keys allowed (RAGFlow sends them)
        name: str = Field(max_length=255)
        size: int | None = None

    @bp.post("/things")
    @spec.validate(json=CreateThing, tags=["things"])
    def create_thing(): ...

``json=`` for a JSON body, ``query=`` for query parameters (:class:`Query`; values
arrive as text), ``form=`` for multipart. The request is checked before the view
runs: a body that breaks the schema is answered 400, code 101, naming the field in the
words :func:`api.http.field` uses. The view still reads the body as before
(``json_body()``), so a schema only has to say what is allowed. Routes without a
declaration are listed too (path, method, path parameters). Reading the document:
``/api/v1/openapi.json``; for people: ``/api/v1/docs`` (served here, no CDN).
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable
from typing import Any

from flask import abort, jsonify, make_response, request
from pydantic import BaseModel, ConfigDict
from spectree import SecurityScheme, SecuritySchemeData, SpecTree
from spectree.plugins.base import Context
from spectree.plugins.flask_plugin import FlaskPlugin
from spectree.utils import default_after_handler

from api.errors import ArgumentError
from api.http import json_body, json_type


class Body(BaseModel):
    """A JSON request body: unknown keys are allowed and kept for the view."""

    model_config = ConfigDict(extra="allow")


class Query(BaseModel):
    """Query parameters (text, as they arrive); unknown ones are allowed."""

    model_config = ConfigDict(extra="allow")


class _Plugin(FlaskPlugin):
    """spectree's Flask plugin that hands the view's reply back untouched.

    Without a response model spectree still re-reads the reply's body, which would
    buffer a server-sent-events stream to its end; a stream must stay a stream.
    """

    def find_routes(self):  # noqa: ANN201 - spectree's signature
        # spectree leaves out everything under its own path (``/api/v1``): only the
        # document itself, the page for people and static files are left out here.
        for rule in self.get_current_app().url_map.iter_rules():
            if rule.endpoint.startswith("openapi") or rule.endpoint in ("static", "docs.api_docs"):
                continue
            yield rule

    def request_validation(
        self, request: Any, query: Any, json: Any, form: Any, headers: Any, cookies: Any
    ) -> None:
        # The body's own checks first (nesting depth, lone surrogates, numbers out of
        # range: api.http.json_body), so a malformed body gets their words and the
        # schema only ever sees a body that parses safely.
        if (
            json is not None
            and request.method not in ("GET", "DELETE")
            # The header as clients send it, else as Werkzeug reads it (case, parameters).
            and (
                request.environ.get("CONTENT_TYPE") == "application/json"
                or request.mimetype == "application/json"
            )
        ):
            body = json_body(required=False)
            if query is None and form is None and headers is None and cookies is None:
                # The common case, a JSON body alone: checked as parsed above, once (the
                # view's json_body() gets the same object), not parsed again by spectree.
                # A body whose declared keys all hold exactly their declared kinds is
                # valid without building the model (views read json_body(), never the
                # model); anything else, valid or not, goes through pydantic as before.
                plain = plain_fields(json)
                if plain is None or not fits(plain, body):
                    request.context = Context(
                        None, self.model_adapter.validate_obj(json, body), None, None, None
                    )
                return
        super().request_validation(request, query, json, form, headers, cookies)

    def validate(  # noqa: PLR0913 - spectree's signature
        self,
        func: Callable,
        query: Any,
        json: Any,
        form: Any,
        headers: Any,
        cookies: Any,
        resp: Any,
        before: Any,
        after: Any,
        validation_error_status: int,
        skip_validation: bool,
        force_resp_serialize: bool,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """spectree's request check, then the view; its reply goes to Flask as it is.

        Our routes declare no reply model and no ``after`` hook, so spectree's reply
        step (unpack the reply, make it a response again, call a hook that does
        nothing) is skipped; anything else takes spectree's own path.
        """
        if resp is not None or skip_validation or after is not default_after_handler:
            return super().validate(
                func, query, json, form, headers, cookies, resp, before, after,
                validation_error_status, skip_validation, force_resp_serialize, *args, **kwargs,
            )  # fmt: skip
        req = request._get_current_object()  # type: ignore[attr-defined] - one context lookup
        try:
            self.request_validation(req, query, json, form, headers, cookies)
        except self.model_adapter.validation_error as err:
            # refuse_invalid raises the 400 in our words; spectree's own reply otherwise.
            response = make_response(
                jsonify(self.model_adapter.validation_errors(err)), validation_error_status
            )
            before(req, response, err, None, self.model_adapter)
            abort(response)
        before(req, None, None, None, self.model_adapter)
        return func(*args, **kwargs)

    def validate_response(
        self, resp: Any, resp_model: Any, skip_validation: bool, force_resp_serialize: bool
    ):  # noqa: ANN201
        if resp_model is None:
            return make_response(resp), None
        return super().validate_response(resp, resp_model, skip_validation, force_resp_serialize)


#: The kinds a JSON body holds, as json_body() reads them.
_JSON_KINDS = frozenset({str, bool, int, float, dict, list, type(None)})


@functools.cache
def plain_fields(model: type[BaseModel]) -> tuple[dict[str, frozenset], tuple[str, ...]] | None:
    """``({key: kinds}, required keys)`` when every field of ``model`` is a plain JSON kind
    or a union of them, without constraints or validators; else ``None``.

    A value whose type is exactly one of its field's kinds is what pydantic accepts
    as it is, so a body whose declared keys all hold such values is valid.
    """
    decorators = model.__pydantic_decorators__
    if model.model_config.get("extra") != "allow" or any(
        (
            decorators.validators,
            decorators.field_validators,
            decorators.root_validators,
            decorators.model_validators,
        )
    ):
        return None
    kinds_of: dict[str, frozenset] = {}
    required = []
    for name, info in model.model_fields.items():
        kinds = (
            typing.get_args(info.annotation)
            if typing.get_origin(info.annotation) in (typing.Union, types.UnionType)
            else (info.annotation,)
        )
        if info.metadata or info.validation_alias not in (None, info.alias) or not set(kinds) <= _JSON_KINDS:
            return None
        keys = [info.alias or name]
        if info.alias and info.alias != name:
            keys.append(name)  # given by its name (populate_by_name), never required so
        for key in keys:
            if key in kinds_of:  # two fields read one key: left to pydantic
                return None
            kinds_of[key] = frozenset(kinds)
        if info.is_required():
            required.append(keys[0])
    return kinds_of, tuple(required)


def fits(fields: tuple[dict[str, frozenset], tuple[str, ...]], body: dict) -> bool:
    """Whether ``body`` is valid as it is for the model whose :func:`plain_fields` are ``fields``."""
    # By the body's keys (a request sends a few of the declared ones), then the required.
    kinds_of, required = fields
    for key, value in body.items():
        kinds = kinds_of.get(key)
        if kinds is not None and type(value) not in kinds:
            return False
    for key in required:
        if key not in body:
            return False
    return True


_TYPE_WORDS = {
    "string": "text",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "dict": "an object",
    "list": "a list",
    "model": "an object",
}


def _sentence(error: dict) -> str:
    loc = ".".join(str(p) for p in error.get("loc", ()) if p != "__root__")
    kind = str(error.get("type", ""))
    ctx = error.get("ctx") or {}
    given = error.get("input")
    if not loc:
        return f"the request body must be a JSON object, got {json_type(given)}"
    if kind == "missing":
        return f"{loc!r} is required"
    if kind == "string_too_long":
        return f"{loc!r} is {len(given)} characters long; the limit is {ctx.get('max_length')}"
    if kind == "too_long":
        return f"{loc!r} has {len(given)} items; the limit is {ctx.get('max_length')}"
    base = kind.split("_", 1)[0]
    if kind.endswith("_type") and base in _TYPE_WORDS:
        return f"{loc!r} must be {_TYPE_WORDS[base]}, got {json_type(given)}"
    return f"{loc!r}: {error.get('msg', 'is not valid')}"


def refuse_invalid(req: Any, resp: Any, error: Exception | None, instance: Any, adapter: Any = None) -> None:
    """spectree's ``before`` hook: a request that breaks its schema is a 400 naming the field."""
    if error is None:
        return
    errors = error.errors() if hasattr(error, "errors") else []
    sentences = [_sentence(e) for e in errors[:5]] or [str(error)]
    raise ArgumentError("; ".join(dict.fromkeys(sentences)))


#: RAGFlow's envelope: every ``/api/v1`` reply that is JSON.
ENVELOPE = {
    "type": "object",
    "required": ["code", "message"],
    "properties": {
        "code": {"type": "integer", "description": "0 on success; RAGFlow's error codes otherwise"},
        "message": {"type": "string"},
        "data": {},
    },
}
_TEXT = {"schema": {"type": "string"}}


def _responses(path: str, operation: dict) -> dict:
    """What a route answers, for the routes that do not declare it."""
    if not path.startswith("/api/v1/"):
        content = {
            "application/json": {"schema": {"type": "object"}},
            "text/html": _TEXT,
            "text/plain": _TEXT,
        }
        return {"default": {"description": "the reply", "content": content}}
    content = {"application/json": {"schema": ENVELOPE}}
    if path.endswith("completions") or path.endswith(("/regenerate", "/undo")):
        content["text/event-stream"] = {
            "schema": {"type": "string", "description": "data:<event json> frames, then data:[DONE]"}
        }
    if path.endswith("/download"):
        content["application/octet-stream"] = _TEXT
    return {"default": {"description": "RAGFlow's envelope {code, message, data}", "content": content}}


class _Spec(SpecTree):
    """spectree, with a reply described for every route (RAGFlow's envelope) and the
    view's docstring as the operation's description."""

    def _generate_spec(self) -> dict:
        document = super()._generate_spec()
        for path, operations in document.get("paths", {}).items():
            for operation in operations.values():
                if not operation.get("responses"):
                    operation["responses"] = _responses(path, operation)
        return document


spec = _Spec(
    "flask",
    backend=_Plugin,
    title="agentcanvas REST API",
    version="v1",
    description="RAGFlow-compatible agent API. Authenticate with 'Authorization: Bearer <api token>'.",
    path="api/v1",
    filename="openapi.json",
    openapi_version="3.1.0",
    validation_error_status=400,
    before=refuse_invalid,
    security_schemes=[SecurityScheme(name="bearer", data=SecuritySchemeData(type="http", scheme="bearer"))],
    security={"bearer": []},
    page_templates={},
    annotations=False,  # views read the body themselves (json_body), not injected models
)


def _fields(schema: dict | None, document: dict) -> list[dict]:
    """``[{name, type, required, description}]`` of an object schema (``$ref`` followed)."""
    if not schema:
        return []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = document.get("components", {}).get("schemas", {}).get(name, {})
    required = set(schema.get("required") or ())
    out = []
    for name, prop in (schema.get("properties") or {}).items():
        kinds = [
            p.get("type") for p in prop.get("anyOf", [prop]) if p.get("type") and p.get("type") != "null"
        ]
        out.append(
            {
                "name": prop.get("alias", name),
                "type": " or ".join(kinds) or "any",
                "required": name in required,
                "description": prop.get("description", ""),
            }
        )
    return out


def operations(document: dict) -> list[tuple[str, list[dict]]]:
    """The document's operations grouped by tag, for the page for people."""
    groups: dict[str, list[dict]] = {}
    for path, ops in sorted(document.get("paths", {}).items()):
        for method, op in ops.items():
            body = (op.get("requestBody") or {}).get("content", {}).get("application/json", {}).get("schema")
            entry = {
                "method": method.upper(),
                "path": path,
                "description": op.get("description") or "",
                "parameters": [
                    {
                        "name": p["name"],
                        "in": p["in"],
                        "required": p.get("required", False),
                        "type": (p.get("schema") or {}).get("type", ""),
                    }
                    for p in op.get("parameters", [])
                ],
                "body": _fields(body, document),
            }
            groups.setdefault((op.get("tags") or ["other"])[0], []).append(entry)
    return sorted(groups.items())
