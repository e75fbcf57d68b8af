"""The harmful samples' second line of evidence and the order they are named in
(forensics.detect.rules.harmful_samples): content evidence first, a text unlike every cluster first, one sample per
block (samples always in the same steps) before any block's second, the block's rarest text first; then by effect."""

from __future__ import annotations

import pandas as pd
import pytest

from forensics.detect.evidence.content import ContentEvidence
from forensics.detect.rules.harmful_samples import corroborated, most_harmful_first


def _row(sid: int, steps: tuple[int, ...], effect: float, flagged: bool = True, z: float = 5.0) -> dict:
    return {"sample_id": sid, "steps": list(steps), "content": ["why"] if flagged else [], "effect": effect, "z": z}


def _evidence(rarity: dict[int, float], unlike: set[int]) -> ContentEvidence:
    table = pd.DataFrame({"rarity": pd.Series(rarity, dtype=float)})
    table.index.name = "sample_id"
    return ContentEvidence(table, {}, unlike)


A, B, C = (1, 9), (2, 8), (3, 7)  # three blocks' steps


@pytest.mark.parametrize(
    ("rows", "rarity", "unlike", "expected"),
    [
        # a block of two unlike rows beside two other blocks: each block's rarest first, then the block's second,
        # though its effect is the largest
        (
            [_row(10, A, 1.6), _row(11, A, 1.6), _row(20, B, 1.4), _row(30, C, 0.8)],
            {10: 0.9, 11: 5.1, 20: 4.8, 30: 5.0},
            {10, 11, 20, 30},
            [11, 20, 30, 10],
        ),
        # a block's rarity decides within it only: across blocks, effect first
        (
            [_row(10, A, 1.6), _row(20, B, 1.4)],
            {10: 0.5, 20: 6.0},
            {10, 20},
            [10, 20],
        ),
        # content evidence before unlike-ness before the place in the block
        (
            [_row(10, A, 1.6, flagged=False), _row(11, A, 1.6), _row(20, B, 0.5)],
            {10: 9.0, 11: 1.0, 20: 1.0},
            {20},
            [20, 11, 10],
        ),
        # equal rarity in a block: by id
        (
            [_row(12, A, 1.0), _row(11, A, 1.0)],
            {11: 2.0, 12: 2.0},
            set(),
            [11, 12],
        ),
        # without a measured rarity (no tokens): 0, so a measured block-mate comes first
        (
            [_row(11, A, 1.0), _row(12, A, 1.0)],
            {12: 0.7},
            set(),
            [12, 11],
        ),
    ],
)
def test_most_harmful_first(rows, rarity, unlike, expected) -> None:
    assert [x["sample_id"] for x in most_harmful_first(rows, _evidence(rarity, unlike))] == expected


def _scored(scores: dict[int, float]) -> ContentEvidence:
    table = pd.DataFrame({"content_score": pd.Series(scores, dtype=float)})
    table.index.name = "sample_id"
    return ContentEvidence(table)


@pytest.mark.parametrize(
    ("appearances", "scores", "expected"),
    [
        ([2], {1: 2.0}, True),  # one sample back twice, its text strongly odd
        ([2], {1: 1.99}, False),  # a weak flag (just past the flagging SDs) is not proof
        ([1], {1: 6.0}, False),  # strongly odd, but consumed once: nothing came back
        ([2, 2], {}, True),  # two samples whose appearances agree
        ([2, 1], {}, False),  # only one of them came back
        ([2, 1], {2: 6.0}, False),  # the odd one was consumed once
        ([], {}, False),
    ],
)
def test_a_second_line_of_evidence(appearances, scores, expected) -> None:
    rows = [{"sample_id": i + 1, "appearances": a} for i, a in enumerate(appearances)]
    assert corroborated(rows, _scored(scores)) is expected
