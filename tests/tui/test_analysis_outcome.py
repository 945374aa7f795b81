"""Whether xtop's background `deeptrace analyze` failed is its exit status, not words in its stderr; the message
shown is what the command said last."""

from __future__ import annotations

from pathlib import Path

from xtop.analysis import Analysis


def _ended(returncode: int, *lines: str) -> Analysis:
    return Analysis(Path("run"), returncode=returncode, lines=list(lines))


def test_success_is_exit_status_zero_even_with_error_words_on_stderr() -> None:
    assert _ended(0, "warning: 3 error kernels were ignored").failure is None
    assert Analysis(Path("run")).failure is None  # still running


def test_a_refusal_shows_deeptrace_own_message() -> None:
    assert _ended(2, "reading traces", "deeptrace: error: run: no traces").failure == "deeptrace: error: run: no traces"


def test_a_crash_without_the_word_error_is_a_failure_with_its_status() -> None:
    failure = _ended(1, "Traceback (most recent call last):", "  ...", "KeyError: 'ts'").failure
    assert failure == "KeyError: 'ts' (deeptrace analyze exited with status 1)"
    assert _ended(-9).failure == "deeptrace analyze exited with status -9"
