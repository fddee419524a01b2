"""UserFillUp: pause the run and ask the user to fill in a form (docs/design.md §5).

Params: ``inputs`` (the form), ``enable_tips`` (default true) and ``tips`` (text with
references, rendered when the run pauses). Outputs: one per field, read as
``{UserFillUp:Name@field}``.
"""

from __future__ import annotations

from agent.component import register
from agent.component.base import ComponentParamBase
from agent.component.form_base import FormComponent
from agent.forms import normalize_form


class UserFillUpParam(ComponentParamBase):
    def __init__(self) -> None:
        super().__init__()
        self.enable_tips = True
        self.tips = ""
        self.layout_recognize = ""

    def check(self) -> None:
        normalize_form(self.inputs, "inputs")
        if not isinstance(self.tips, str):
            raise ValueError(f"tips must be text, got {self.tips!r}")


@register
class UserFillUp(FormComponent):
    component_name = "UserFillUp"
    side_effect_free = True
    param_class = UserFillUpParam

    def _invoke(self, **kwargs) -> None:
        self.collect()

    def tips(self) -> str:
        if not self._param.enable_tips or not self._param.tips:
            return ""
        return self.render(self._param.tips)
