"""Validation, deduplication and the difficulty mix of candidate scenarios.

Duplicates are caught three ways: the same normalised text, the same semantic key (template
and parameters of a ``sql`` scenario, whatever the wording) and, for free text, near-
duplicates by token-set Jaccard similarity. Two tasks that differ in a number ("hired in
2019" / "in 2020") are different tasks and are never merged.
"""

from __future__ import annotations

import random
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable

from mcprl_common.wire import Scenario

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
MIN_TASK_CHARS = 10
MAX_TASK_CHARS = 2000


def normalise(text: str) -> str:
    """Lower case, NFKC, punctuation dropped, whitespace collapsed."""

    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(_WORD.findall(text))


def tokens(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(unicodedata.normalize("NFKC", text).casefold()))


def numbers(text: str) -> tuple[str, ...]:
    return tuple(sorted(n.replace(",", "") for n in _NUMBER.findall(text)))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


_TABLE_BEFORE = re.compile(r"\b[`\"']?([A-Za-z_]\w*)[`\"']?\s+table\b", re.I)
_TABLE_QUOTED = re.compile(r"\btable\s+[`\"']([A-Za-z_]\w*)[`\"']", re.I)


def validate(scenario: Scenario, known_tables: Iterable[str] = ()) -> str | None:
    """Why ``scenario`` is unusable, or None. Catches invented tables on SQL servers."""

    task = scenario.task.strip()
    if len(task) < MIN_TASK_CHARS:
        return "task too short"
    if len(task) > MAX_TASK_CHARS:
        return "task too long"
    if sum(ch.isalpha() for ch in task) < 5:
        return "task has no words"
    if not 1 <= scenario.difficulty <= 5:
        return "difficulty out of 1-5"
    tables = {t.casefold() for t in known_tables}
    if tables and scenario.template is None:  # template tasks are built from the schema
        named = [m.group(1) for m in _TABLE_BEFORE.finditer(task)]
        named += [m.group(1) for m in _TABLE_QUOTED.finditer(task)]
        for name in named:
            low = name.casefold()
            if low not in tables and low not in _STOP and f"{low}s" not in tables:
                return f"task names a table that does not exist: {name}"
    return None


_STOP = {
    "the", "a", "an", "each", "every", "that", "this", "which", "one", "same", "its", "their",
    "any", "all", "other", "another", "your", "our", "given", "whole", "entire", "lookup",
    "data", "database", "them", "it", "those", "these", "both", "either", "some", "first",
    "second", "third", "last", "relevant", "appropriate", "corresponding", "respective",
    "of", "in", "to", "for", "with", "and", "or", "named", "called", "containing", "lists",
}


class Deduplicator:
    """Accepts scenarios one at a time and refuses duplicates of those already accepted."""

    def __init__(self, near_threshold: float = 0.85) -> None:
        self.near_threshold = near_threshold
        self._texts: set[str] = set()
        self._keys: set[str] = set()
        self._free: list[tuple[frozenset[str], tuple[str, ...]]] = []
        self.rejected: dict[str, int] = defaultdict(int)

    def why_duplicate(self, scenario: Scenario) -> str | None:
        norm = normalise(scenario.task)
        if norm in self._texts:
            return "exact duplicate"
        key = scenario.metadata.get("key")
        if key and key in self._keys:
            return "same template and parameters"
        if scenario.template is None:
            toks, nums = tokens(scenario.task), numbers(scenario.task)
            for other_toks, other_nums in self._free:
                if other_nums != nums:
                    continue
                small, big = sorted((len(toks), len(other_toks)))
                if big and small / big < self.near_threshold:
                    continue
                if jaccard(toks, other_toks) >= self.near_threshold:
                    return "near duplicate"
        return None

    def add(self, scenario: Scenario) -> bool:
        """Record ``scenario`` unless it duplicates one seen before; True when kept."""

        reason = self.why_duplicate(scenario)
        if reason is not None:
            self.rejected[reason] += 1
            return False
        self._texts.add(normalise(scenario.task))
        if key := scenario.metadata.get("key"):
            self._keys.add(key)
        if scenario.template is None:
            self._free.append((tokens(scenario.task), numbers(scenario.task)))
        return True


def dedupe(scenarios: Iterable[Scenario], near_threshold: float = 0.85) -> list[Scenario]:
    dedup = Deduplicator(near_threshold)
    return [s for s in scenarios if dedup.add(s)]


def mix_targets(n: int, mix: dict[int, float] | None) -> dict[int, int]:
    """Counts per difficulty summing to ``n`` (largest remainder); uniform when no mix."""

    weights = {d: float((mix or {}).get(d, 0.0 if mix else 1.0)) for d in range(1, 6)}
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("difficulty_mix needs a positive weight")
    exact = {d: n * w / total for d, w in weights.items()}
    counts = {d: int(v) for d, v in exact.items()}
    rest = n - sum(counts.values())
    for d in sorted(exact, key=lambda d: (-(exact[d] - counts[d]), d))[:rest]:
        counts[d] += 1
    return counts


def select_by_mix(
    pool: list[Scenario], n: int, mix: dict[int, float] | None, rng: random.Random
) -> tuple[list[Scenario], list[str]]:
    """Pick ``n`` scenarios following the mix, spread over templates; shortfalls borrow from
    the nearest difficulty and are reported as warnings."""

    by_level: dict[int, list[Scenario]] = defaultdict(list)
    for s in pool:
        by_level[s.difficulty].append(s)
    for level in by_level.values():
        rng.shuffle(level)
        level[:] = _round_robin_by_template(level)
    targets = mix_targets(n, mix)
    chosen: list[Scenario] = []
    warnings: list[str] = []
    short = 0
    for d in range(1, 6):
        take = by_level[d][: targets[d]]
        del by_level[d][: targets[d]]
        chosen.extend(take)
        if len(take) < targets[d]:
            warnings.append(f"difficulty {d}: {len(take)} of {targets[d]} available")
            short += targets[d] - len(take)
    while short > 0:
        spare = [d for d in range(1, 6) if by_level[d]]
        if not spare:
            break
        wanted = [d for d in range(1, 6) if targets[d] > 0] or [3]
        centre = sum(wanted) / len(wanted)
        d = min(spare, key=lambda lv: (abs(lv - centre), lv))
        chosen.append(by_level[d].pop(0))
        short -= 1
    if short > 0:
        warnings.append(f"only {len(chosen)} unique scenarios available of {n} requested")
    return chosen, warnings


def _round_robin_by_template(items: list[Scenario]) -> list[Scenario]:
    queues: dict[str, list[Scenario]] = defaultdict(list)
    for s in items:
        queues[s.template or ""].append(s)
    out: list[Scenario] = []
    while queues:
        for name in list(queues):
            out.append(queues[name].pop(0))
            if not queues[name]:
                del queues[name]
    return out


def difficulty_counts(scenarios: Iterable[Scenario]) -> dict[str, int]:
    counts = {str(d): 0 for d in range(1, 6)}
    for s in scenarios:
        counts[str(s.difficulty)] += 1
    return counts
