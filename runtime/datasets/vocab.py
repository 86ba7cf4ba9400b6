"""The character-level vocabulary and tokenizer of the CLUE datasets.

A vocabulary file has one token per line; a token's id is its line number (0-based), as in BERT's
``vocab.txt``. It must hold the special tokens below, with ``[PAD]`` at id 0 (BERT models embed
id 0 as padding). Text is tokenized the way BERT's Chinese models see it, without WordPiece:
each CJK character is a token; a run of other letters and digits is one lower-cased token if the
vocabulary has it, else one token per character; whitespace separates; anything not in the
vocabulary becomes ``[UNK]``.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Iterable, Sequence

from hfai.datasets.errors import ConvertError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIALS = (PAD, UNK, CLS, SEP, MASK)


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2FA1F
        or 0xF900 <= cp <= 0xFAFF or 0x3000 <= cp <= 0x303F or 0xFF00 <= cp <= 0xFFEF
    )


def pieces(text: str) -> list[str]:
    """Split ``text`` into candidate tokens (before the vocabulary look-up)."""
    out: list[str] = []
    word: list[str] = []
    for ch in text:
        if ch.isalnum() and not _is_cjk(ch):
            word.append(ch.lower())
            continue
        if word:
            out.append("".join(word))
            word = []
        if not ch.isspace():
            out.append(ch)
    if word:
        out.append("".join(word))
    return out


class Vocab:
    """Token ↔ id, with the ids of the special tokens as attributes (``pad``, ``cls``, ...)."""

    def __init__(self, tokens: Sequence[str], source: str = "<vocab>"):
        self.tokens = list(tokens)
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        missing = [t for t in SPECIALS if t not in self.ids]
        if missing:
            raise ConvertError(f"{source}: vocabulary lacks the special tokens {', '.join(missing)}")
        if self.ids[PAD] != 0:
            raise ConvertError(f"{source}: {PAD} must be the first line (id 0), it is line {self.ids[PAD] + 1}")
        self.pad, self.unk, self.cls, self.sep, self.mask = (self.ids[t] for t in SPECIALS)

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no [CLS]/[SEP] added)."""
        ids = []
        for piece in pieces(text):
            if piece in self.ids:
                ids.append(self.ids[piece])
            else:
                ids.extend(self.ids.get(ch, self.unk) for ch in piece)
        return ids

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocab:
        with open(path, encoding="utf-8") as f:
            tokens = [line.rstrip("\n").rstrip("\r") for line in f]
        while tokens and not tokens[-1]:
            tokens.pop()
        return cls(tokens, str(path))

    @classmethod
    def build(cls, texts: Iterable[str], size: int) -> Vocab:
        """The specials, then the ``size - 5`` most frequent characters of ``texts``."""
        counts: collections.Counter[str] = collections.Counter()
        for text in texts:
            counts.update(ch for piece in pieces(text) for ch in piece)
        ranked = sorted(counts, key=lambda ch: (-counts[ch], ch))
        return cls([*SPECIALS, *ranked[: max(0, size - len(SPECIALS))]])

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(t + "\n" for t in self.tokens)
