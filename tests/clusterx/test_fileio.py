"""clusterx.fileio.write_atomically, the workspace's one atomic file write: a reader sees the old file or the new
one, never a mix, with concurrent writers in threads and in processes; a failed write leaves the old file and no
temporary one."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path

import pytest
from clusterx.fileio import write_atomically

SIZE = 256 * 1024  # large enough that a plain write would be seen half done


def _payload(writer: int) -> bytes:
    return bytes([65 + writer]) * SIZE


def _write_many(path: str, writer: int, times: int) -> None:
    for _ in range(times):
        write_atomically(Path(path), _payload(writer), fsync=False)


def _whole(data: bytes) -> bool:
    return len(data) == SIZE and data == data[:1] * SIZE


def test_concurrent_writers_never_show_a_mixed_file(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_atomically(path, _payload(0))
    threads = [threading.Thread(target=_write_many, args=(str(path), i, 30)) for i in range(1, 4)]
    processes = [multiprocessing.get_context("spawn").Process(target=_write_many, args=(str(path), i, 30))
                 for i in range(4, 6)]  # fmt: skip
    for worker in (*threads, *processes):
        worker.start()
    seen = set()
    while any(t.is_alive() for t in threads) or any(p.is_alive() for p in processes):
        data = path.read_bytes()
        assert _whole(data), f"a mixed or partial file of {len(data)} bytes"
        seen.add(data[:1])
    for thread in threads:
        thread.join()
    for process in processes:
        process.join()
        assert process.exitcode == 0
    assert _whole(path.read_bytes())
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left behind


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "marker.json"
    write_atomically(path, '{"step": 1}')

    def disk_full(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, '{"step": 2}')
    assert path.read_text() == '{"step": 1}'
    assert [p.name for p in tmp_path.iterdir()] == ["marker.json"]


def test_text_is_utf8_and_the_folder_can_be_made_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda descriptor: synced.append(descriptor) or real_fsync(descriptor))
    write_atomically(tmp_path / "a.txt", "∑ ok", fsync=False)
    assert (tmp_path / "a.txt").read_bytes() == "∑ ok".encode() and synced == []
    write_atomically(tmp_path / "b.txt", b"x", fsync_folder=True)
    assert len(synced) == 2  # the file's content, then the folder holding its new name
