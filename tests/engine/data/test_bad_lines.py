"""Bad lines (invalid JSON, missing fields, empty text, an unknown role) are skipped and counted, the first few
are logged as file:line with the reason, and a source without one valid line is a DataError naming its file."""

from pathlib import Path

import pytest
from xtrain.data import cache, prepare_corpus
from xtrain.errors import DataError

from .corpora import data_config, pretrain_records, write_jsonl

GOOD = {"text": "a usable line"}
ASSISTANT = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]


def test_bad_pretrain_lines_are_skipped_counted_and_logged_with_file_and_line(tmp_path: Path) -> None:
    lines = [
        GOOD,
        '{"text": "unterminated',  # line 2
        {"body": "no text field"},  # line 3
        GOOD,
        {"text": "   "},  # line 5
        "",  # a blank line is neither a document nor a bad line
        GOOD,
    ]
    source = write_jsonl(tmp_path / "mixed.jsonl", lines)
    logged: list[str] = []
    corpus = prepare_corpus(data_config([source], tmp_path / "cache"), log=logged.append)

    assert corpus.num_documents == 3
    assert corpus.skipped_lines == 3
    assert len(logged) == 3
    for message, line, reason in zip(logged, [2, 3, 5], ["invalid JSON", '"text"', "empty"], strict=True):
        assert f"{source}:{line}:" in message and reason in message


def test_an_unknown_role_is_a_skipped_chat_line(tmp_path: Path) -> None:
    robot = [{"role": "user", "content": "q"}, {"role": "robot", "content": "beep"}]
    source = write_jsonl(tmp_path / "chat.jsonl", [{"messages": ASSISTANT}, {"messages": robot}])
    logged: list[str] = []
    corpus = prepare_corpus(data_config([source], tmp_path / "cache", kind="chat"), log=logged.append)
    assert (corpus.num_documents, corpus.skipped_lines) == (1, 1)
    assert len(logged) == 1 and f"{source}:2:" in logged[0] and "robot" in logged[0]


def test_only_the_first_few_bad_lines_are_logged_but_all_are_counted(tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "noisy.jsonl", [GOOD, *(["not json"] * 30)])
    logged: list[str] = []
    corpus = prepare_corpus(data_config([source], tmp_path / "cache"), log=logged.append)
    assert corpus.skipped_lines == 30
    assert 1 < len(logged) <= 10  # a few lines, not thirty
    assert "30" in logged[-1]  # the total is still reported
    assert all(f"{source}:{n}:" in message for n, message in zip(range(2, 32), logged[:-1], strict=False))


def test_line_numbers_stay_right_in_later_cache_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "PART_BYTES", 200)  # a part every few lines
    records = pretrain_records(40, seed=9)
    records[33] = {"text": ""}  # line 34
    source = write_jsonl(tmp_path / "long.jsonl", records)
    assert source.stat().st_size > 5 * cache.PART_BYTES
    logged: list[str] = []
    corpus = prepare_corpus(data_config([source], tmp_path / "cache"), log=logged.append)
    assert corpus.skipped_lines == 1
    assert len(logged) == 1 and f"{source}:34:" in logged[0]


def test_a_source_without_a_valid_line_is_an_error_naming_the_file(tmp_path: Path) -> None:
    fine = write_jsonl(tmp_path / "fine.jsonl", [GOOD])
    broken = write_jsonl(tmp_path / "broken.jsonl", ['{"txt": 1}', "nope"])
    with pytest.raises(DataError) as raised:
        prepare_corpus(data_config([fine, broken], tmp_path / "cache"), log=lambda _: None)
    message = str(raised.value)
    assert str(broken) in message and str(fine) not in message
    assert f"{broken}:1:" in message  # and the first bad line, so the fix is obvious


@pytest.mark.parametrize("content", ["", "\n\n"])
def test_an_empty_file_is_an_error_naming_it(tmp_path: Path, content: str) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text(content)
    with pytest.raises(DataError, match=str(empty)):
        prepare_corpus(data_config([empty], tmp_path / "cache"), log=lambda _: None)


def test_a_missing_source_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.jsonl"
    folder = tmp_path / "no-jsonl"
    folder.mkdir()
    (folder / "readme.txt").write_text("{}\n")
    for source in (missing, folder):
        with pytest.raises(DataError, match=str(source)):
            prepare_corpus(data_config([source], tmp_path / "cache"), log=lambda _: None)


def test_a_bad_line_is_logged_with_its_own_file_when_another_file_has_the_same_content(tmp_path: Path) -> None:
    lines = [GOOD, "not json"]
    original = write_jsonl(tmp_path / "a" / "data.jsonl", lines)
    copy = write_jsonl(tmp_path / "b" / "data.jsonl", lines)  # same bytes: the two share one cache entry
    logged: list[str] = []
    prepare_corpus(data_config([original, copy], tmp_path / "cache"), log=logged.append)
    assert len(logged) == 2
    assert f"{original}:2:" in logged[0] and f"{copy}:2:" in logged[1]
