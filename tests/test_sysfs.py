"""The CPU-cache reader of minigpt.hardware (Lesson 09), on fake sysfs folders: it must pick the largest cache,
parse every unit sysfs uses, and skip folders it cannot read instead of failing."""
from __future__ import annotations

import pytest

from minigpt.hardware import largest_cpu_cache, parse_cache_size


def fake_cache(root, index: int, level, size) -> None:
    d = root / f"index{index}"
    d.mkdir()
    if level is not None:
        (d / "level").write_text(f"{level}\n")
    if size is not None:
        (d / "size").write_text(f"{size}\n")


@pytest.mark.parametrize("text, expected", [("32K", 32 * 1024), ("1M", 2**20), ("2G", 2 * 2**30), ("512", 512),
                                            ("48k\n", 48 * 1024)])
def test_parse_cache_size(text, expected):
    assert parse_cache_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "abcK", "1.5M"])
def test_parse_cache_size_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_cache_size(text)


def test_largest_cache_is_found_whatever_the_folder_order(tmp_path):
    fake_cache(tmp_path, 0, 1, "48K")     # L1 data
    fake_cache(tmp_path, 1, 1, "32K")     # L1 instruction
    fake_cache(tmp_path, 2, 3, "32768K")  # L3 listed before L2
    fake_cache(tmp_path, 3, 2, "2048K")
    assert largest_cpu_cache(str(tmp_path)) == ("L3", 32 * 2**20)


def test_broken_folders_are_skipped(tmp_path):
    fake_cache(tmp_path, 0, 2, "1M")
    fake_cache(tmp_path, 1, 3, None)       # no size file
    fake_cache(tmp_path, 2, None, "64M")   # no level file
    fake_cache(tmp_path, 3, 3, "lots")     # unparseable size
    assert largest_cpu_cache(str(tmp_path)) == ("L2", 2**20)


def test_no_caches_reported_gives_none(tmp_path):
    assert largest_cpu_cache(str(tmp_path)) is None
    assert largest_cpu_cache(str(tmp_path / "absent")) is None


def test_this_machine_answers_none_or_a_plausible_cache():
    found = largest_cpu_cache()
    assert found is None or (found[0].startswith("L") and found[1] >= 1024)
