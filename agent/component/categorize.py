"""Categorize: let the model pick a category and route to that category's components.

Params: ``category_description`` — ``{name: {description, examples: [text], to: [ids]}}``
(names may carry trailing spaces, as in RAGFlow's templates; they are matched
without them) — ``query``, a bare reference to the text to classify (default
``sys.query``), ``default_category`` (ours; optional), and the LLM params
(``llm_id``, ``sys_prompt`` — added to the instructions —, sampling options,
``message_history_window_size``, ``memory_key``).

Outputs: ``category_name`` (the name as written in the DSL) and ``_next`` (the ids
routed to, as RAGFlow).

Reading the answer: a reply that is exactly a category name (case, quotes and
trailing punctuation aside) picks it; otherwise the category named most often in
the reply as a whole word (the first named on a tie); a reply naming none goes to
the **default**: ``default_category`` if set, else the **last** category (where
RAGFlow routes it too). It never fails on an odd answer.

Memory: the node remembers the query and the category it chose.
"""

from __future__ import annotations

import re
from typing import Any

from agent.component import register
from agent.component.llm import LLM, LLMParam
from agent.refs import parse_ref, to_text
from agent.stream import LazyText


class CategorizeParam(LLMParam):
    def __init__(self) -> None:
        super().__init__()
        self.category_description: Any = {}
        self.query: Any = "sys.query"
        self.default_category: Any = ""

    def check(self) -> None:
        super().check()
        cats = self.category_description
        if not isinstance(cats, dict) or not cats:
            raise ValueError(
                "category_description must be a non-empty object {name: {description, examples, to: [ids]}}"
            )
        seen: dict[str, str] = {}
        for name, cat in cats.items():
            clean = name.strip()
            if not clean:
                raise ValueError("category_description has a category with an empty name")
            if clean.lower() in seen:
                raise ValueError(f"categories {seen[clean.lower()]!r} and {name!r} have the same name")
            seen[clean.lower()] = name
            if not isinstance(cat, dict):
                raise ValueError(
                    f"category {name!r} must be an object {{description, examples, to}}, got {cat!r}"
                )
            to = cat.get("to")
            if isinstance(to, str):
                to = cat["to"] = [to]
            if not isinstance(to, list) or not to or not all(isinstance(t, str) and t for t in to):
                raise ValueError(f"category {name!r} needs 'to': a non-empty list of component ids")
            examples = cat.get("examples") or []
            if isinstance(examples, str):  # older RAGFlow templates: one example per line
                examples = examples.splitlines()
            if not isinstance(examples, list):
                raise ValueError(f"category {name!r}: examples must be a list of texts")
            cat["examples"] = [to_text(e) for e in examples if e not in (None, "") and to_text(e).strip()]
            if not isinstance(cat.get("description", "") or "", str):
                raise ValueError(f"category {name!r}: description must be text")
        if self.query in (None, ""):
            self.query = "sys.query"
        if not isinstance(self.query, str) or parse_ref(self.query) is None:
            raise ValueError(
                f"query must be a reference such as 'sys.query' or 'begin@question' (no braces needed), "
                f"got {self.query!r}"
            )
        if self.default_category:
            if (
                not isinstance(self.default_category, str)
                or self.default_category.strip().lower() not in seen
            ):
                raise ValueError(
                    f"default_category {self.default_category!r} is not one of the categories "
                    f"({', '.join(repr(n.strip()) for n in cats)})"
                )


@register
class Categorize(LLM):
    component_name = "Categorize"
    param_class = CategorizeParam
    takes_files = False
    bare_ref_params = ("query",)

    def possible_next(self) -> list[str]:
        ids = super().possible_next()
        for cat in self._param.category_description.values():
            ids += [t for t in cat["to"] if t not in ids]
        return ids

    def default_category(self) -> str:
        """``default_category`` if set, else the last category (RAGFlow's choice)."""
        cats = list(self._param.category_description)
        default = self._param.default_category
        if default:
            return {n.strip().lower(): n for n in cats}[default.strip().lower()]
        return cats[-1]

    def fallback_next(self) -> list[str]:
        """A failed classification replaced by its default value takes the default category."""
        return list(self._param.category_description[self.default_category()]["to"])

    def _streams_to_message(self) -> bool:
        return False  # the answer is a category name, read whole

    def system_prompt(self) -> str:
        lines = [
            "Classify the user's message into exactly one of the categories below. "
            "Answer with the category name only, nothing else.",
            "",
            "Categories:",
        ]
        for name, cat in self._param.category_description.items():
            description = (cat.get("description") or "").replace("\n", " ").strip()
            lines.append(f"- {name.strip()}: {description}" if description else f"- {name.strip()}:")
        examples = [
            f"Example ({name.strip()}): {' '.join(e.split())}"
            for name, cat in self._param.category_description.items()
            for e in cat["examples"]
        ]
        if examples:
            lines += ["", *examples]
        extra = super().system_prompt()
        if extra:
            lines += ["", extra]
        return "\n".join(lines)

    def prompt_messages(self, kwargs: dict) -> list[dict]:
        value = self.get_value(self._param.query)
        return [{"role": "user", "content": value.text if isinstance(value, LazyText) else to_text(value)}]

    def accept_answer(self, answer: str) -> str:
        name = self.pick(answer)
        to = list(self._param.category_description[name]["to"])
        self.set_output("category_name", name)
        self.set_output("_next", to)
        self._next = to
        return name.strip()

    def pick(self, answer: str) -> str:
        """The category an answer names, else the default (see the module docstring)."""
        cats = list(self._param.category_description)
        by_clean = {n.strip().lower(): n for n in cats}
        said = answer.strip().strip("\"'`*.!。 \n").strip().lower()
        if said in by_clean:
            return by_clean[said]
        best, best_count, best_pos = None, 0, len(answer) + 1
        lowered = answer.lower()
        for clean, name in by_clean.items():
            hits = [m.start() for m in re.finditer(rf"(?<!\w){re.escape(clean)}(?!\w)", lowered)]
            if hits and (len(hits) > best_count or (len(hits) == best_count and hits[0] < best_pos)):
                best, best_count, best_pos = name, len(hits), hits[0]
        return best if best is not None else self.default_category()
