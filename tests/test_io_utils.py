"""`io_utils`: a report is only written over an earlier report of its kind (or with overwrite)."""

import json
import re

import pytest

from hf_dspark.io_utils import check_replaceable, is_json_report

KEYS = ("config", "results")


def test_is_json_report_needs_an_object_with_every_key(tmp_path):
    path = tmp_path / "report.json"
    assert not is_json_report(path, KEYS)  # missing
    assert not is_json_report(tmp_path, KEYS)  # a folder
    for text in ("", "{oops", "[1, 2]", '"config results"', '{"config": 1}', '{"turns": ["hi"]}\n{"turns": []}\n'):
        path.write_text(text)
        assert not is_json_report(path, KEYS), text
    path.write_bytes(b"\xff\xfe\x00binary")
    assert not is_json_report(path, KEYS)
    path.write_text(json.dumps({"config": {}, "results": [], "extra": 1}))
    assert is_json_report(path, KEYS)
    assert is_json_report(path, [])  # any JSON object


def test_check_replaceable_refuses_a_foreign_file_and_leaves_it_alone(tmp_path):
    notes = tmp_path / "notes.json"
    notes.write_text('{"mine": 1}')
    with pytest.raises(ValueError, match=re.escape(f"--out {notes} exists and is not a speed report; choose another "
                                                   "path or pass --overwrite to replace it.")):
        check_replaceable(notes, KEYS, "a speed report")
    assert notes.read_text() == '{"mine": 1}'
    check_replaceable(notes, KEYS, "a speed report", overwrite=True)  # allowed; the caller writes it later
    assert notes.read_text() == '{"mine": 1}'


def test_check_replaceable_accepts_a_new_path_and_an_earlier_report(tmp_path):
    check_replaceable(tmp_path / "new.json", KEYS, "a speed report")
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"config": {}, "results": {}}))
    check_replaceable(earlier, KEYS, "a speed report")


@pytest.mark.parametrize("overwrite", [False, True])
def test_check_replaceable_refuses_a_folder(tmp_path, overwrite):
    with pytest.raises(ValueError, match="is a folder; give the report's file path"):
        check_replaceable(tmp_path, KEYS, "a speed report", overwrite=overwrite)


def test_atomic_writes_get_ordinary_permissions_and_keep_a_replaced_files(tmp_path):
    """mkstemp makes private files; a report or config must be as readable as any other file the user writes."""
    import os
    import stat

    from hf_dspark.io_utils import current_umask, write_text_atomic

    new = tmp_path / "report.json"
    write_text_atomic(new, "{}")
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~current_umask()
    os.chmod(new, 0o640)
    write_text_atomic(new, "{}\n")
    assert stat.S_IMODE(new.stat().st_mode) == 0o640 and new.read_text() == "{}\n"
    old = os.umask(0o077)
    try:
        assert current_umask() == 0o077
    finally:
        os.umask(old)
