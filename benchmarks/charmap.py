"""The resolver's character map: ``locate.build_frame`` against the growing-prefix definition, side by side in one run.

A frame needs, for every row, the decoded content and the character where each
content token starts. ``build_frame`` gets it from each distinct id's piece
(decoded once after a fixed lead token), checks the pieces spell the row's
decoded text, and falls back per row to ``char_map_naive`` — one decode per
prefix, O(L^2) — where they do not. This measures both on 64 rows x 260 content
tokens (plus the tokenizer's own prefix, BOS on the sentencepiece ones),
left-padded into ``(ids, mask)`` as the compiler builds them, and prints the
medians and the ratio naive / fast. The earlier implementation took 840 ms on
tiny-llama's prompts; the target is 50 ms or less.

Rows are generated, not repeated: prompt-like text from the weekday / arithmetic
vocabulary drawn with a seeded ``random.Random``, different on every row, so the
per-id cache is not flattered by identical rows. A second text mixes in
non-ASCII words and emoji: on a byte-level tokenizer their bytes split across
tokens, the pieces stop spelling the text and those rows take the definition;
the ``fallback`` column counts them. Both builds must give the same texts and
offsets on every row, or the run stops: the benchmark cannot report a fast
wrong answer. It prints only; nothing is held to a time.

    python benchmarks/charmap.py               # all three shipped tokenizers, both texts
    python benchmarks/charmap.py --rounds 9
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script from anywhere: the checkout's package, not another install

from causalab_mini.ops import locate  # noqa: E402

TOKENIZERS = ("tiny-llama", "tiny-gpt2", "tiny-gemma2")  # the first is the headline
EARLIER_MS, TARGET_MS = 840.0, 50.0

DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
NUMBERS = ("one", "two", "three", "four", "five", "six", "seven")
TEMPLATES = (
    "If today is {d}, tomorrow is {e}.",
    "If today is {d}, tomorrow is",
    "Q: What day is {n} days after {d}?\nA: {e}",
    "Q: What day is {n} days after {d}?\nA:",
    "{d} plus {k} days is {e}.",
    "Yesterday was {d}; {n} days later it is {e}.",
    "[INST] Name a weekday. [/INST] {d}",
    "{k} + {j} = {s}, so {n} days after {d} is {e}.",
    "Is {e} {n} days after {d}? Yes.",
    "The weekday after {d} is {e}",
)
# The harder text: accents, dashes, CJK and emoji (multi-byte in UTF-8, so split across byte-level tokens).
EXOTIC = ("café", "naïve", "Mañana", "Ünïcödé", "—", "…", "→", "½", "東京", "日曜日", "😀", "🗓️", "👍🏽", "✓")


def sentence(rng: random.Random, hard: bool) -> str:
    i, k, j = rng.randrange(7), rng.randrange(1, 8), rng.randrange(1, 8)
    text = rng.choice(TEMPLATES).format(d=DAYS[i], e=DAYS[(i + k) % 7], n=NUMBERS[k - 1], k=k, j=j, s=k + j)
    if hard and rng.random() < 0.3:
        words = text.split(" ")
        words.insert(rng.randrange(len(words) + 1), rng.choice(EXOTIC))
        text = " ".join(words)
    return text


def make_rows(tok, rows: int, tokens: int, hard: bool, seed: int):
    """(ids, mask): ``rows`` different texts, each cut to exactly ``tokens`` content tokens after the
    tokenizer's prefix, padded on the left by hand (as ``locate.encode_rows`` does)."""
    rng = random.Random(seed)
    prefix = list(locate.special_prefix(tok))
    encoded = []
    for _ in range(rows):
        parts: list[str] = []
        while True:
            parts += [sentence(rng, hard) for _ in range(8)]
            ids = list(tok(rng.choice((" ", "\n")).join(parts))["input_ids"])
            if ids[:len(prefix)] != prefix:
                raise RuntimeError(f"{tok.name_or_path}: encoding does not start with the prefix {prefix}")
            if len(ids) - len(prefix) >= tokens:
                encoded.append(ids[:len(prefix) + tokens])
                break
    width = max(len(e) for e in encoded)
    pad = locate.pad_id(tok)
    ids = tuple(tuple([pad] * (width - len(e)) + e) for e in encoded)
    mask = tuple(tuple([0] * (width - len(e)) + [1] * len(e)) for e in encoded)
    return ids, mask


def naive_frame(tok, ids, mask):
    """What ``build_frame`` computes, by the definition: the same spans, ``char_map_naive`` on every row."""
    spans = locate.content_spans(mask, len(locate.special_prefix(tok)))
    maps = [locate.char_map_naive(tok, row[a:b]) for row, (a, b) in zip(ids, spans)]
    return spans, tuple(t for t, _ in maps), tuple(o for _, o in maps)


def fallbacks(tok, ids, spans) -> int:
    """Rows whose pieces do not spell their text: the rows ``char_map`` hands to the definition."""
    pieces = locate._Pieces(tok)
    count = 0
    for row, (a, b) in zip(ids, spans):
        content = list(row[a:b])
        if locate._offsets_from_pieces(tok, content, locate.decode(tok, content), pieces) is None:
            count += 1
    return count


def check(name: str, frame, naive) -> None:
    """Stop the run unless the fast frame is the definition's, row for row."""
    spans, texts, offsets = naive
    if (frame.starts, frame.ends) != (tuple(a for a, _ in spans), tuple(b for _, b in spans)):
        raise AssertionError(f"{name}: build_frame's content spans differ from content_spans")
    for r, (t, o) in enumerate(zip(texts, offsets)):
        if frame.texts[r] != t or frame.offsets[r] != o:
            k = next((k for k, (x, y) in enumerate(zip(frame.offsets[r], o)) if x != y), None)
            raise AssertionError(f"{name}: row {r} differs from char_map_naive "
                                 f"(text equal: {frame.texts[r] == t}; first offset differing at token {k})")


def measure(tok, ids, mask, rounds: int):
    """Warm up both builds (and check them against each other), then take turns; the median seconds of each."""
    fast = lambda: locate.build_frame(tok, ids, mask)  # noqa: E731
    naive = lambda: naive_frame(tok, ids, mask)  # noqa: E731
    frame, reference = fast(), naive()
    check(tok.name_or_path, frame, reference)
    times: dict = {"fast": [], "naive": []}
    for _ in range(rounds):
        for label, build in (("naive", naive), ("fast", fast)):
            start = time.perf_counter()
            build()
            times[label].append(time.perf_counter() - start)
    return statistics.median(times["fast"]), statistics.median(times["naive"]), reference[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed turns of each build after the warm-up")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=260, help="content tokens per row (after BOS)")
    parser.add_argument("--seed", type=int, default=0)
    opts = parser.parse_args(argv)

    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()

    print(f"character map: {opts.rows} rows x {opts.tokens} content tokens, median of {opts.rounds} rounds "
          f"after a warm-up; fast = locate.build_frame, naive = char_map_naive per row", flush=True)
    headline = None
    for name in TOKENIZERS:
        tok = AutoTokenizer.from_pretrained(REPO / "documents" / "models" / name)
        for text, hard in (("prompts", False), ("non-ascii", True)):
            ids, mask = make_rows(tok, opts.rows, opts.tokens, hard, opts.seed)
            fast, naive, spans = measure(tok, ids, mask, opts.rounds)
            fell = fallbacks(tok, ids, spans)
            distinct = len({t for row, (a, b) in zip(ids, spans) for t in row[a:b]})
            if headline is None:
                headline = fast
            print(f"  {name:<12} {text:<10} fast {fast * 1e3:8.1f} ms   naive {naive * 1e3:8.1f} ms   "
                  f"{naive / fast:6.1f}x   fallback {fell:>3}/{opts.rows} rows   {distinct:>3} distinct ids",
                  flush=True)
    print(f"  {TOKENIZERS[0]} prompts: {headline * 1e3:.1f} ms against a target of <= {TARGET_MS:.0f} ms "
          f"(earlier implementation: {EARLIER_MS:.0f} ms); every fast frame equal to the naive one")
    return 0


if __name__ == "__main__":
    sys.exit(main())
