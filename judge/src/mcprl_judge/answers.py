"""Reading an agent's free-text answer: the answer itself, numbers in it, names in it.

Agents answer in prose ("The average salary is about $120.5k."), so the verifiable check
cannot compare strings. These helpers turn prose into comparable pieces: numbers (with
thousands separators, currency, percent and k/M/B suffixes) and normalised text in which a
name can be found on word boundaries.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from mcprl_common.wire import Trajectory

_SCALE = {"k": 1e3, "thousand": 1e3, "m": 1e6, "mm": 1e6, "million": 1e6, "b": 1e9,
          "bn": 1e9, "billion": 1e9}
_WORD_NUMBERS = {"zero": 0, "none": 0, "one": 1, "two": 2, "three": 3, "four": 4,
                 "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
                 "eleven": 11, "twelve": 12}
# A sign only counts when it does not follow a digit or letter (so "2021-03-04" is no "-03").
_NUMBER = re.compile(
    r"(?<![\w.\-−])(?P<sign>[-−])?\s?(?P<cur>[$€£])?\s?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+)?)"
    r"(?:\s?(?P<suffix>thousand|million|billion|bn|mm|[kKmMbB])(?![A-Za-z]))?"
    r"(?P<pct>\s?%|\s?percent)?"
)
_WORD_NUMBER = re.compile(r"\b(" + "|".join(_WORD_NUMBERS) + r")\b", re.IGNORECASE)


@dataclass(frozen=True)
class FoundNumber:
    """A number read from text; ``alternatives`` holds other readings (15% -> 15 and 0.15)."""

    value: float
    start: int
    alternatives: tuple[float, ...] = ()

    def readings(self) -> tuple[float, ...]:
        return (self.value, *self.alternatives)


def content_text(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string or a list of content parts."""

    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return str(content)


def final_answer(trajectory: Trajectory) -> str:
    """The agent's answer: ``final_answer`` (complete_task), else its last words."""

    if trajectory.final_answer and trajectory.final_answer.strip():
        return trajectory.final_answer.strip()
    for message in reversed(trajectory.messages):
        if message.get("role") == "assistant":
            text = content_text(message.get("content")).strip()
            if text:
                return text
    return ""


def parse_numbers(text: str, *, words: bool = True) -> list[FoundNumber]:
    """Every number in ``text`` in reading order: "$1,234.5", "15%", "120k", "-3", "five"."""

    found: list[FoundNumber] = []
    for m in _NUMBER.finditer(text):
        value = float(m.group("num").replace(",", ""))
        suffix = (m.group("suffix") or "").lower()
        if suffix:
            value *= _SCALE[suffix]
        if m.group("sign"):
            value = -value
        alternatives: tuple[float, ...] = ()
        if m.group("pct"):
            alternatives = (value / 100.0,)
        found.append(FoundNumber(value, m.start(), alternatives))
    if words:
        for m in _WORD_NUMBER.finditer(text):
            found.append(FoundNumber(float(_WORD_NUMBERS[m.group(1).lower()]), m.start()))
        found.sort(key=lambda n: n.start)
    return found


def numbers_close(a: float, b: float, rel_tol: float, abs_tol: float) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


def relative_error(found: float, expected: float) -> float:
    """How far ``found`` is from ``expected``, as a fraction of ``expected``."""

    return abs(found - expected) / max(abs(expected), 1e-12)


def normalise(text: str) -> str:
    """Casefolded, accents stripped, punctuation to spaces, whitespace collapsed."""

    decomposed = unicodedata.normalize("NFKD", text)
    stripped = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    lowered = stripped.casefold().replace("&", " and ")
    return " ".join(re.sub(r"[^\w]+", " ", lowered).split())


def find_phrase(normalised_text: str, phrase: str) -> int | None:
    """Where ``phrase`` (normalised here) starts in ``normalised_text`` on word boundaries."""

    needle = normalise(phrase)
    if not needle:
        return None
    hay = f" {normalised_text} "
    idx = hay.find(f" {needle} ")
    return None if idx < 0 else idx


def as_number(value: Any) -> float | None:
    """``value`` as a float when it is (or reads as exactly) one number, else None."""

    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        m = _NUMBER.fullmatch(value.strip())
        if m is not None:
            return parse_numbers(m.group(0), words=False)[0].value
    return None


# Words that mark a piece of prose rather than a listed name (for extra-item detection).
_FUNCTION_WORDS_TEXT = """
a an the is are was were be been of in on at to for from by with which that who whose
there here these those this it its they their has have had and or not no none all total
result results answer following found list query database table employee employees
project projects department departments
"""
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS_TEXT.split())


def split_items(text: str) -> list[str]:
    """Split a listing answer into items: lines, bullets, commas, semicolons, 'and'."""

    pieces = re.split(r"\n|;|,(?!\d{3})|\band\b|\u2022|\s-\s", text)
    items = []
    for piece in pieces:
        piece = re.sub(r"^\s*(?:[-*]|\d+[.)])\s*", "", piece).strip(" \t.:!?\"'`()[]{}")
        if piece:
            items.append(piece)
    return items
