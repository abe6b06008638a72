"""Graded exercises: ``check(name, fn)`` grades a learner's function inside a notebook.

    from minigpt.grading import check
    check("attend_with_cache", attend_with_cache)   # one PASS/FAIL line per case, then "Score: x/y points"

The exercises live in ``exercises/`` (generated from ``solutions/`` by ``python -m minigpt.grading.make_exercises``);
``python -m minigpt.grade PATH`` runs whole notebooks headless and prints a score table.
"""
# importing a grader module registers its exercise's cases
from . import ex01, ex02, ex03, ex04, ex05, ex06, ex07, ex08, ex09, ex10  # noqa: F401
from .core import EXERCISES, RESULTS, CaseResult, Mismatch, Result, check

__all__ = ["check", "CaseResult", "EXERCISES", "Mismatch", "RESULTS", "Result"]
