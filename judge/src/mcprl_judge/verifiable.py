"""Verifiable rewards: the agent's final answer against the scenario's ground truth.

Each answer kind has a checker (a small base class + registry, like every variant here):
``number`` (tolerance), ``text`` (normalised phrase), ``set`` (names in any order) and
``list`` (names in order). A checker gives a strict verdict (``correct``, the 0/1 component
``verifiable``) and partial credit (``verifiable_partial`` in [0, 1], e.g. F1 for sets),
which gives RL a gradient on questions the agent half answers.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from mcprl_common.wire import GroundTruth
from mcprl_judge.answers import (
    FUNCTION_WORDS,
    FoundNumber,
    as_number,
    find_phrase,
    normalise,
    numbers_close,
    parse_numbers,
    relative_error,
    split_items,
)

# An answer naming more numbers than this is a dump, not an answer.
MAX_NUMBERS_IN_NUMBER_ANSWER = 10
# A listed item this long (words) is prose, not an extra name.
MAX_NAME_WORDS = 5
_EMPTY_SET_WORDS = re.compile(r"\b(none|no|nobody|nothing|zero|0|empty|neither)\b")


@dataclass(frozen=True)
class VerifiableResult:
    correct: bool
    partial: float
    detail: str


class AnswerChecker(ABC):
    """Checks one kind of ground truth."""

    kind: ClassVar[str]

    @abstractmethod
    def check(self, answer: str, truth: GroundTruth) -> VerifiableResult: ...


CHECKERS: dict[str, AnswerChecker] = {}


def register(cls: type[AnswerChecker]) -> type[AnswerChecker]:
    CHECKERS[cls.kind] = cls()
    return cls


def check_answer(answer: str, truth: GroundTruth) -> VerifiableResult:
    """Check ``answer`` against ``truth``; an empty answer is never correct."""

    if not answer.strip():
        return VerifiableResult(False, 0.0, "no answer")
    return CHECKERS[truth.kind].check(answer, truth)


def _values(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _match_number(
    expected: float, found: list[FoundNumber], used: set[int], truth: GroundTruth
) -> int | None:
    for i, number in enumerate(found):
        if i in used:
            continue
        if any(numbers_close(r, expected, truth.rel_tol, truth.abs_tol) for r in number.readings()):
            return i
    return None


@register
class NumberChecker(AnswerChecker):
    """One number within ``rel_tol``/``abs_tol``; partial credit falls linearly to 0 at 50% off."""

    kind = "number"

    def check(self, answer: str, truth: GroundTruth) -> VerifiableResult:
        expected = as_number(_values(truth.value)[0])
        if expected is None:
            return TextChecker().check(answer, truth)
        found = parse_numbers(answer)
        if not found:
            return VerifiableResult(False, 0.0, f"expected {expected:g}; no number in the answer")
        distinct = {round(n.value, 9) for n in found}
        hit = _match_number(expected, found, set(), truth)
        if hit is not None and len(distinct) <= MAX_NUMBERS_IN_NUMBER_ANSWER:
            return VerifiableResult(True, 1.0, f"expected {expected:g}; found {found[hit].value:g}")
        if hit is not None:
            return VerifiableResult(
                False, 0.5, f"expected {expected:g}; found among {len(distinct)} numbers (a dump)"
            )
        best = min(relative_error(r, expected) for n in found for r in n.readings())
        partial = max(0.0, 1.0 - best / 0.5)
        return VerifiableResult(
            False, round(partial, 6), f"expected {expected:g}; closest is {best:.1%} off"
        )


@register
class TextChecker(AnswerChecker):
    """The expected text as a phrase of the normalised answer; partial = token recall."""

    kind = "text"

    def check(self, answer: str, truth: GroundTruth) -> VerifiableResult:
        expected = str(_values(truth.value)[0])
        number = as_number(expected)
        if number is not None and truth.kind == "text":
            return NumberChecker().check(answer, truth.model_copy(update={"value": number}))
        norm = normalise(answer)
        if find_phrase(norm, expected) is not None:
            return VerifiableResult(True, 1.0, f"expected {expected!r}; found")
        tokens = normalise(expected).split()
        words = set(norm.split())
        recall = sum(t in words for t in tokens) / len(tokens) if tokens else 0.0
        return VerifiableResult(False, round(recall, 6), f"expected {expected!r}; not found")


@dataclass
class _ItemMatch:
    positions: list[int | None]  # per expected item, where it was found
    extras: list[str]  # listed items that match nothing expected


def _match_items(answer: str, expected: list[Any], truth: GroundTruth) -> _ItemMatch:
    numeric = [as_number(v) for v in expected]
    if expected and all(n is not None for n in numeric):
        found = parse_numbers(answer, words=False)
        used: set[int] = set()
        positions: list[int | None] = []
        for value in numeric:
            assert value is not None
            hit = _match_number(value, found, used, truth)
            if hit is not None:
                used.add(hit)
            positions.append(None if hit is None else found[hit].start)
        limit = 3 * len(expected) + 3
        extras = [str(n.value) for i, n in enumerate(found) if i not in used]
        return _ItemMatch(positions, extras if len(found) > limit else [])
    norm = normalise(answer)
    positions = [find_phrase(norm, str(v)) for v in expected]
    extras = []
    for item in split_items(answer):
        item_norm = normalise(item)
        words = item_norm.split()
        if not words or len(words) > MAX_NAME_WORDS or not re.search(r"[a-z]", item_norm):
            continue
        if any(w in FUNCTION_WORDS for w in words):
            continue
        if any(find_phrase(item_norm, str(v)) is not None for v in expected):
            continue
        extras.append(item)
    return _ItemMatch(positions, extras)


def _f1(precision: float, recall: float) -> float:
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def _longest_increasing(values: list[int]) -> int:
    tails: list[int] = []
    for v in values:
        lo, hi = 0, len(tails)
        while lo < hi:
            mid = (lo + hi) // 2
            if tails[mid] < v:
                lo = mid + 1
            else:
                hi = mid
        if lo == len(tails):
            tails.append(v)
        else:
            tails[lo] = v
    return len(tails)


@register
class SetChecker(AnswerChecker):
    """All expected names, any order, nothing extra; partial = F1 of found vs listed names."""

    kind = "set"
    ordered: ClassVar[bool] = False

    def check(self, answer: str, truth: GroundTruth) -> VerifiableResult:
        expected = _values(truth.value)
        if not expected:
            return self._empty(answer)
        match = _match_items(answer, expected, truth)
        found = [p for p in match.positions if p is not None]
        recall = len(found) / len(expected)
        precision = len(found) / (len(found) + len(match.extras)) if found else 0.0
        in_order = len(found)
        if self.ordered:
            in_order = _longest_increasing(found)
            recall = in_order / len(expected)
        correct = len(found) == len(expected) and in_order == len(expected) and not match.extras
        detail = f"found {len(found)}/{len(expected)} expected"
        if self.ordered:
            detail += f", {in_order} in order"
        if match.extras:
            detail += f", {len(match.extras)} extra ({', '.join(match.extras[:3])})"
        return VerifiableResult(correct, round(_f1(precision, recall), 6), detail)

    def _empty(self, answer: str) -> VerifiableResult:
        says_none = _EMPTY_SET_WORDS.search(normalise(answer)) is not None
        return VerifiableResult(says_none, 1.0 if says_none else 0.0,
                                "expected no items; " + ("answer says none" if says_none
                                                         else "answer does not say none"))


@register
class ListChecker(SetChecker):
    """Like ``set``, and the order counts (top-k questions): recall is the in-order part."""

    kind = "list"
    ordered = True
