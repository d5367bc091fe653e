"""Chat rows: a role's field holding a list of ``{"role", "content"}`` messages.

A list is rendered through the checkpoint's own chat template when the document
is compiled; the turns travel beside the text, and ``tokens.turn_spans`` finds
each one in the decoded ids (the resolver's coordinates), not in this string.
"""
from __future__ import annotations

import json
from pathlib import Path

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
    except Exception as err:  # noqa: BLE001 - the template is the checkpoint's code: any failure is its own
        problem, fix = _failure(err)
        raise CompileError(path, f"the checkpoint's chat template ({template_source(tok)}) fails on row {row}: "
                           f"{problem}", f"{fix}, or use plain-text prompts") from None
    # The template writes the BOS itself; the tokenizer will add it again when it
    # encodes, so it is taken off here and the prompt's own text starts after it.
    bos = getattr(tok, "bos_token", None)
    if bos and text.startswith(bos) and tok("")["input_ids"]:
        text = text[len(bos):]
    return Rendered(text, tuple((m["role"], m["content"]) for m in value))


def _failure(err: Exception) -> tuple[str, str]:
    """What went wrong inside a template that parsed, and what to do about it."""
    # transformers renders a chat template alone, in an environment with no loader, so jinja
    # raises a bare TypeError for anything that would load another template.
    if isinstance(err, TypeError) and "no loader" in str(err):
        return ("it loads another template ({% include %}, {% import %} or {% extends %}), and a chat "
                "template is rendered on its own, with nowhere to load one from",
                "write what it includes into the chat template itself")
    return f"{type(err).__name__}: {err}", "fix the checkpoint's chat_template"


def template_source(tok) -> str:
    """Where the tokenizer's chat template was read from, as a person would open it: the local
    checkpoint's chat_template.jinja (which transformers prefers) or tokenizer_config.json's
    chat_template, when its text is the template in use; else the tokenizer's name."""
    root = Path(getattr(tok, "name_or_path", "") or "")
    template = getattr(tok, "chat_template", None)
    jinja, config = root / "chat_template.jinja", root / "tokenizer_config.json"
    try:
        if jinja.is_file() and jinja.read_text(encoding="utf-8") == template:
            return str(jinja)
        if config.is_file() and json.loads(config.read_text(encoding="utf-8")).get("chat_template") == template:
            return f"chat_template in {config}"
    except (OSError, ValueError, AttributeError):
        pass  # only naming the file: an unreadable one is not this refusal's business
    return f"tokenizer {str(root)!r}"


def _kind_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return "an array" if isinstance(value, list) else "an object"
