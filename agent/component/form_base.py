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
from agent.forms import final_values, missing_required, normalize_form, public_form

# Shared params object -> its normalised form (goes with the params when the memo drops them).
_FORMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class FormComponent(ComponentBase):
    is_form = True

    def form(self) -> dict[str, dict]:
        """The form's fields, worked out once per params object: once per process for
        params every canvas shares (read-only, so the fields are too)."""
        form = self.__dict__.get("_form")
        if form is None:
            param = self._param
            shared = is_shared(param)
            form = _FORMS.get(param) if shared else None
            if form is None:
                form = normalize_form(param.inputs, self.id)
                if shared:
                    _FORMS[param] = form
            self._form = form
        return form

    def start_form(self) -> None:
        """Reached afresh (not resumed): earlier answers are never reused."""
        self.data.pop("answers", None)
        self.data.pop("pending", None)
        self.data.pop("asked", None)

    def collect(self) -> dict[str, Any]:
        """Outputs from the answers, or pause if a required field is still missing."""
        form = self.form()
        answers = self.data.get("answers") or {}
        if missing_required(form, answers):
            self.data["pending"] = True
            raise FormPause(self.id)
        self.data.pop("pending", None)
        self.data.pop("asked", None)
        values = final_values(form, answers)
        for key, value in values.items():
            self.set_output(key, value)
        self.inputs_seen = dict(answers)
        return values

    def tips(self) -> str:
        return ""

    def pause_form(self) -> dict[str, dict]:
        """The fields being asked: the whole form at first, then only the missing ones."""
        form = self.form()
        answers = self.data.get("answers") or {}
        if self.data.get("asked") and answers:
            return public_form(form, missing_required(form, answers))
        return public_form(form)

    def pause_data(self) -> dict:
        """The ``user_inputs`` event's data for this pause."""
        fields = self.pause_form()
        self.data["asked"] = True
        tips = self.tips()
        return {"component_id": self.id, "inputs": fields, "tips": tips, "content": tips}
