"""Chat rows: a role's field holding a list of ``{"role", "content"}`` messages.

A list is rendered through the checkpoint's own chat template when the document
is compiled; the turns travel beside the text, and ``tokens.turn_spans`` finds
each one in the decoded ids (the resolver's coordinates), not in this string.
"""
from __future__ import annotations

from ..errors import CompileError, DataError
from .tokens import Rendered


def render_row(tok, value, path: str, row: int) -> Rendered:
    if isinstance(value, str):
        return Rendered(value)
    if not (isinstance(value, list) and value
            and all(isinstance(m, dict) and set(m) == {"role", "content"} for m in value)):
        raise DataError(path, f"row {row}: a prompt is a string or a list of "
                        "{\"role\", \"content\"} messages", "fix the row's field")
    for i, message in enumerate(value):
        for key in ("role", "content"):
            if not isinstance(message[key], str):
                raise DataError(path, f"row {row}: message {i}'s {key} is {_kind_of(message[key])}, not text",
                                'write each message as {"role": "user", "content": "the text"}')
    if not getattr(tok, "chat_template", None):
        raise CompileError(path, "this field holds chat messages and the checkpoint has no chat "
                           "template", "use a plain-text field, or a checkpoint with a template")
    from jinja2 import TemplateError, TemplateSyntaxError

    try:
        text = tok.apply_chat_template(value, tokenize=False)
    except TemplateSyntaxError as err:
        raise CompileError(path, f"the checkpoint's chat template is not a template ({err.message}, line "
                           f"{err.lineno})", "fix the checkpoint's chat_template, or use plain-text prompts") from None
    except TemplateError as err:  # the template's own rule (roles alternating, a system turn first)
        raise DataError(path, f"row {row}: the checkpoint's chat template refuses these messages "
                        f"({err.message or type(err).__name__})",
                        "write the conversation as this checkpoint's template takes it") from None
    # The template writes the BOS itself; the tokenizer will add it again when it
    # encodes, so it is taken off here and the prompt's own text starts after it.
    bos = getattr(tok, "bos_token", None)
    if bos and text.startswith(bos) and tok("")["input_ids"]:
        text = text[len(bos):]
    return Rendered(text, tuple((m["role"], m["content"]) for m in value))


def _kind_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return "an array" if isinstance(value, list) else "an object"
