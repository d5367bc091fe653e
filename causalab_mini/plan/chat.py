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
    if not getattr(tok, "chat_template", None):
        raise CompileError(path, "this field holds chat messages and the checkpoint has no chat "
                           "template", "use a plain-text field, or a checkpoint with a template")
    text = tok.apply_chat_template(value, tokenize=False)
    # The template writes the BOS itself; the tokenizer will add it again when it
    # encodes, so it is taken off here and the prompt's own text starts after it.
    bos = getattr(tok, "bos_token", None)
    if bos and text.startswith(bos) and tok("")["input_ids"]:
        text = text[len(bos):]
    return Rendered(text, tuple((m["role"], m["content"]) for m in value))
