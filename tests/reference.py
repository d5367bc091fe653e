"""The hand-made side of the engine tests: a left-padded batch and an answer id, built
directly from a tokenizer with no causalab_mini code, so the numbers the engines are
held to are computed independently of them."""
from __future__ import annotations

import torch


def padded(tok, texts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, mask, position ids): left padded by hand, positions counted from each row's first real token."""
    encoded = [tok(t)["input_ids"] for t in texts]
    width = max(len(e) for e in encoded)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def answer_id(tok, word: str) -> int:
    """The first token of ``word`` said after a space: encode "a " + word, take the first new id."""
    head = tok("a", add_special_tokens=False)["input_ids"]
    full = tok("a " + word.strip(), add_special_tokens=False)["input_ids"]
    assert full[: len(head)] == head and len(full) > len(head)
    return full[len(head)]


def hidden_of(output):
    """The tensor a module returned: itself, or a tuple's first element (a decoder layer's)."""
    return output[0] if isinstance(output, tuple) else output


def with_hidden(output, new):
    """``output`` with its tensor replaced by ``new``, in the same shape of value."""
    return (new, *output[1:]) if isinstance(output, tuple) else new


def continued(tok, ids) -> str:
    """How ``ids`` read when they continue a text, as a continuation does: decoded after a
    prompt and the prompt's own text taken off. Decoded alone, a sentencepiece tokenizer
    drops the leading space of the first piece; after a prompt it keeps it."""
    prompt = tok("If today is", add_special_tokens=False)["input_ids"]
    before = tok.decode(prompt, skip_special_tokens=False)
    return tok.decode(prompt + list(ids), skip_special_tokens=False)[len(before):]
