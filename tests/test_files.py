"""files.py: writing a report never changes the process's umask, and a new file is 0666 less it."""

from __future__ import annotations

import os
import stat

import pytest

from energyprof.store import files


@pytest.mark.parametrize("mask", [0o077, 0o022, 0o002])
def test_a_new_report_follows_the_umask_without_setting_it(tmp_path, monkeypatch, mask) -> None:
    """Defect: writing a report set the umask to 022 for a moment to read it, so a program thread
    creating a file then made it 0644 where its own umask said 0600."""
    set_by_us: list[int] = []
    real_umask = os.umask

    def watched(value: int) -> int:  # the test's own calls go to real_umask, not through here
        set_by_us.append(value)
        return real_umask(value)

    before = real_umask(mask)
    try:
        monkeypatch.setattr(os, "umask", watched)
        files.write_text(str(tmp_path / "r.html"), "<p>report</p>")
        (tmp_path / "kept.json").write_text("{}")
        os.chmod(tmp_path / "kept.json", 0o640)
        files.write_text(str(tmp_path / "kept.json"), "{}\n")
    finally:
        monkeypatch.undo()
        real_umask(before)
    assert set_by_us == []
    assert stat.S_IMODE(os.stat(tmp_path / "r.html").st_mode) == 0o666 & ~mask
    assert stat.S_IMODE(os.stat(tmp_path / "kept.json").st_mode) == 0o640  # an existing file keeps its mode
    assert (tmp_path / "r.html").read_text() == "<p>report</p>"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.json", "r.html"]  # no temporary left behind
