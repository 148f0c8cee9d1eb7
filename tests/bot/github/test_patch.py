"""A fork's patch applies with `git apply` whatever characters its files hold."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bot.github.patch import unified_patch


def test_a_patch_applies_when_files_hold_carriage_returns_form_feeds_and_no_final_newline(tmp_path: Path):
    old = {"m.py": "a = 1\nb = '\r'\n", "gone.txt": "bye\n"}
    new = {"m.py": "a = 2\nb = '\r'\nc = '\x0c\x1c\u2028'\n", "k.b64": "# header\nQUJD\nREVG", "empty.txt": ""}
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for name, text in old.items():
        (tmp_path / name).write_bytes(text.encode())
    (tmp_path / "fix.patch").write_text(unified_patch(old, new))
    subprocess.run(["git", "apply", "fix.patch"], cwd=tmp_path, check=True, capture_output=True)
    for name, text in new.items():
        assert (tmp_path / name).read_bytes() == text.encode()
    assert not (tmp_path / "gone.txt").exists()
