"""What Begin and UserFillUp share: a form that can pause the run (docs/design.md §5).

Bookkeeping in ``data`` (kept in the snapshot while paused):
``answers`` (accepted, converted values), ``pending`` (paused here), ``asked``
(the whole form was already shown once, so a later pause lists only what is missing).
"""

from __future__ import annotations

import weakref
from typing import Any

from agent.component.base import ComponentBase, is_shared
from agent.errors import FormPause
from agent.forms import final_values, is_optional, missing_required, normalize_form, public_form

# Shared params object -> what its form works out to (goes with the params when the memo drops them).
_FORMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Form:
    """A form and what every run asks of it, worked out once.

    Attributes:
        fields: ``{key: field}`` (:func:`~agent.forms.normalize_form`).
        required: keys of the required fields without a default value (those a
            missing answer pauses the run for), in form order.
        defaulted: whether any field has a default value.
        file_fields: keys of the ``file`` fields.
        public: the whole form as a ``user_inputs`` event shows it (copied per event).
    """

    __slots__ = ("defaulted", "fields", "file_fields", "public", "required")

    def __init__(self, fields: dict[str, dict]):
        self.fields = fields
        self.required = tuple(
            k for k, f in fields.items() if not is_optional(f) and f.get("value") in (None, "")
        )
        self.defaulted = any(f.get("value") not in (None, "") for f in fields.values())
        self.file_fields = frozenset(k for k, f in fields.items() if f.get("type") == "file")
        self.public = public_form(fields)

    def missing(self, answers: dict) -> list[str]:
        """:func:`~agent.forms.missing_required` of ``answers``."""
        return [k for k in self.required if answers.get(k) in (None, "")]


class FormComponent(ComponentBase):
    is_form = True
    param_derived = frozenset({"_form"})

    def form(self) -> dict[str, dict]:
        """The form's fields, worked out once per params object: once per process for
        params every canvas shares (read-only, so the fields are too)."""
        return self._worked_out().fields

    def file_fields(self) -> frozenset[str]:
        """The keys of the form's ``file`` fields."""
        return self._worked_out().file_fields

    def _worked_out(self) -> _Form:
        form = self.__dict__.get("_form")
        if form is None:
            param = self._param
            shared = is_shared(param)
            form = _FORMS.get(param) if shared else None
            if form is None:
                form = _Form(normalize_form(param.inputs, self.id))
                if shared:
                    _FORMS[param] = form
            self._form = form
        return form

    def start_form(self) -> None:
        """Reached afresh (not resumed): earlier answers are never reused."""
        data = self.data
        if data:
            data.pop("answers", None)
            data.pop("pending", None)
            data.pop("asked", None)

    def collect(self) -> dict[str, Any]:
        """Outputs from the answers, or pause if a required field is still missing."""
        form = self._worked_out()
        data = self.data
        answers = data.get("answers") or {}
        if form.required and form.missing(answers):
            data["pending"] = True
            raise FormPause(self.id)
        data.pop("pending", None)
        data.pop("asked", None)
        fields = form.fields
        if form.defaulted:
            values = final_values(fields, answers)
        else:  # final_values without defaults to convert: each answer or None
            values = {k: answers.get(k) for k in fields}
        self.outputs.update(values)
        self.inputs_seen = dict(answers)
        return values

    def tips(self) -> str:
        return ""

    def pause_form(self) -> dict[str, dict]:
        """The fields being asked: the whole form at first, then only the missing ones."""
        form = self._worked_out()
        answers = self.data.get("answers") or {}
        if self.data.get("asked") and answers:
            return public_form(form.fields, missing_required(form.fields, answers))
        return {k: dict(f) for k, f in form.public.items()}

    def pause_data(self) -> dict:
        """The ``user_inputs`` event's data for this pause."""
        fields = self.pause_form()
        self.data["asked"] = True
        tips = self.tips()
        return {"component_id": self.id, "inputs": fields, "tips": tips, "content": tips}
