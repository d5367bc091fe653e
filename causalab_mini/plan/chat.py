"""Chat rows: a role's field holding a list of ``{"role", "content"}`` messages.

A list is rendered through the checkpoint's own chat template when the document
is compiled. Each turn's content is found in the rendered text as itself, after
the previous turn, so the template's control tokens sit between turns and
inside none of them.
"""
from __future__ import annotations

from ..errors import CompileError, DataError
from .tokens import Rendered


def render_row(tok, value, path: str, row: int) -> Rendered:
    if isinstance(value, str):
        return Rendered(value, None)
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
    segments: dict = {}
    counts: dict = {}
    cursor = 0
    for message in value:
        start = text.find(message["content"], cursor)
        if start < 0:
            raise CompileError(path, f"row {row}: the chat template did not render the "
                               f"{message['role']} turn's content verbatim", "use a plain-text field")
        end = start + len(message["content"])
        k = counts.get(message["role"], 0)
        counts[message["role"]] = k + 1
        segments[f"{message['role']}[{k}]"] = (start, end)
        cursor = end
    for role, n in counts.items():
        if n == 1:  # the bare name only for a role that spoke once; twice is ambiguous
            segments[role] = segments[f"{role}[0]"]
    return Rendered(text, segments)
