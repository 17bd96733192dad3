"""Text preparation for TorchServe's text handlers, without torchtext (which no longer exists
for current torch): the ``basic_english`` tokenizer, n-grams, contractions, accents, HTML
tags and punctuation, following torchtext's and TorchServe's documented behaviour."""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

# torchtext's basic_english: lower case, then these substitutions, then split on blanks.
_BASIC_ENGLISH: Final = [
    (re.compile(r"\'"), " '  "),
    (re.compile(r"\""), ""),
    (re.compile(r"\."), " . "),
    (re.compile(r"<br \/>"), " "),
    (re.compile(r","), " , "),
    (re.compile(r"\("), " ( "),
    (re.compile(r"\)"), " ) "),
    (re.compile(r"\!"), " ! "),
    (re.compile(r"\?"), " ? "),
    (re.compile(r"\;"), " "),
    (re.compile(r"\:"), " "),
    (re.compile(r"\s+"), " "),
]

# Common English contractions and their expansions (lower case: the text is lowered first).
CONTRACTIONS: Final = {
    "ain't": "is not", "aren't": "are not", "can't": "cannot", "can't've": "cannot have",
    "'cause": "because", "could've": "could have", "couldn't": "could not",
    "didn't": "did not", "doesn't": "does not", "don't": "do not", "hadn't": "had not",
    "hasn't": "has not", "haven't": "have not", "he'd": "he would", "he'll": "he will",
    "he's": "he is", "how'd": "how did", "how'll": "how will", "how's": "how is",
    "i'd": "i would", "i'll": "i will", "i'm": "i am", "i've": "i have", "isn't": "is not",
    "it'd": "it would", "it'll": "it will", "it's": "it is", "let's": "let us",
    "ma'am": "madam", "mightn't": "might not", "might've": "might have",
    "mustn't": "must not", "must've": "must have", "needn't": "need not",
    "shan't": "shall not", "she'd": "she would", "she'll": "she will", "she's": "she is",
    "should've": "should have", "shouldn't": "should not", "that'd": "that would",
    "that's": "that is", "there'd": "there would", "there's": "there is",
    "they'd": "they would", "they'll": "they will", "they're": "they are",
    "they've": "they have", "wasn't": "was not", "we'd": "we would", "we'll": "we will",
    "we're": "we are", "we've": "we have", "weren't": "were not", "what'll": "what will",
    "what're": "what are", "what's": "what is", "what've": "what have",
    "when's": "when is", "where'd": "where did", "where's": "where is",
    "who'll": "who will", "who's": "who is", "who've": "who have", "why's": "why is",
    "won't": "will not", "would've": "would have", "wouldn't": "would not",
    "y'all": "you all", "you'd": "you would", "you'll": "you will", "you're": "you are",
    "you've": "you have",
}  # fmt: skip
_CONTRACTION: Final = re.compile(
    "|".join(re.escape(k) for k in sorted(CONTRACTIONS, key=len, reverse=True))
)
_HTML_TAG: Final = re.compile(r"<.*?>")
_PUNCTUATION: Final = str.maketrans("", "", string.punctuation)


def basic_english(text: str) -> list[str]:
    text = text.lower()
    for pattern, replacement in _BASIC_ENGLISH:
        text = pattern.sub(replacement, text)
    return text.split()


def ngrams(tokens: Sequence[str], n: int) -> Iterator[str]:
    """The tokens, then every 2-gram, ... n-gram joined by a space (torchtext's order)."""
    yield from tokens
    for size in range(2, n + 1):
        for start in range(len(tokens) - size + 1):
            yield " ".join(tokens[start : start + size])


def expand_contractions(text: str) -> str:
    return _CONTRACTION.sub(lambda m: CONTRACTIONS[m.group(0)], text)


def remove_accents(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def remove_html_tags(text: str) -> str:
    return _HTML_TAG.sub("", text)


def remove_punctuation(text: str) -> str:
    return text.translate(_PUNCTUATION)


class Vocabulary:
    """Token -> index, from a ``{token: index}`` dict or a token list (index = position);
    an unknown token maps to ``<unk>``'s index when there is one, else 0."""

    def __init__(self, source: Mapping[str, int] | Sequence[str]) -> None:
        if isinstance(source, Mapping):
            self._index = {str(k): int(v) for k, v in source.items()}
        else:
            self._index = {str(token): i for i, token in enumerate(source)}
        self._unknown = self._index.get("<unk>", 0)

    def __getitem__(self, token: str) -> int:
        return self._index.get(token, self._unknown)

    def __len__(self) -> int:
        return len(self._index)


def vocabulary(loaded: Any, path: str) -> Vocabulary:
    """The vocabulary a ``source_vocab.pt`` held (``torch.load``'s result)."""
    if isinstance(loaded, Mapping | list | tuple):
        return Vocabulary(loaded)
    raise TypeError(
        f"{path} holds a {type(loaded).__name__}; trioserve reads a vocabulary saved as a "
        "{token: index} dict or a list of tokens (torch.save)"
    )


__all__ = [
    "CONTRACTIONS",
    "Vocabulary",
    "basic_english",
    "expand_contractions",
    "ngrams",
    "remove_accents",
    "remove_html_tags",
    "remove_punctuation",
    "vocabulary",
]
