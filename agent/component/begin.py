"""Begin: the start of every canvas (id ``begin``).

Params: ``prologue`` (the greeting a new session shows), ``mode``
(``conversational``, ``task`` or ``Webhook``: see :mod:`api.services.webhooks` for the
webhook's own params) and ``inputs`` (an optional form). Begin's form
answers come from ``Canvas.run(inputs=...)``; in task mode the client sends them on
the first call. If a required field has no answer and no default the run pauses at
Begin with a ``user_inputs`` event, like UserFillUp. Begin's answers hold for the
whole conversation until new ones are sent: ``{begin@field}`` reads them.
"""

from __future__ import annotations

from agent.component import register
from agent.component.base import ComponentParamBase
from agent.component.form_base import FormComponent
from agent.forms import normalize_form


class BeginParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.prologue = ""
        self.mode = "conversational"

    def check(self) -> None:
        if self.mode in ("", None):
            self.mode = "conversational"
        self.check_choice("mode", ("conversational", "task", "Webhook", "webhook"))
        if not isinstance(self.prologue, str):
            raise ValueError(f"prologue must be text, got {self.prologue!r}")
        normalize_form(self.inputs, "inputs")


@register
class Begin(FormComponent):
    component_name = "Begin"
    side_effect_free = True
    param_class = BeginParam

    def start_form(self) -> None:
        # Begin's answers are the conversation's inputs: they outlive the turn.
        self.data.pop("pending", None)
        self.data.pop("asked", None)

    def _invoke(self, **kwargs) -> None:
        self.collect()
        # In webhook mode the triggering request is Begin's output: method, query,
        # headers, body (``{begin@body.order_id}``).
        request = self.data.pop("webhook", None)
        if isinstance(request, dict):
            for key in ("method", "query", "headers", "body"):
                self.set_output(key, request.get(key))
            self.inputs_seen = {"webhook": {k: request.get(k) for k in ("method", "query", "body")}}

    def prologue(self) -> str:
        return self.render(self._param.prologue) if self._param.prologue else ""

    @property
    def mode(self) -> str:
        return self._param.mode
