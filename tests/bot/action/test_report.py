"""The Action's pure parts: outputs that no value can forge, and check-run progress paced for GitHub's limits."""

from __future__ import annotations

import re

from bot.action.entry import _Progress
from bot.action.report import RunReport, console_text, output_block, write_report
from bot.github.platform import CheckOutput, PlatformError
from runner.contract import Progress


def parse(text: str) -> dict[str, str]:
    out, lines, i = {}, text.split("\n"), 0
    while i < len(lines) and lines[i]:
        name, delimiter = lines[i].split("<<", 1)
        end = lines.index(delimiter, i + 1)
        out[name] = "\n".join(lines[i + 1:end])
        i = end + 1
    return out


def test_a_multiline_value_cannot_forge_another_output():
    evil = "1\npr-url=https://evil.example\nghadelimiter_x\nbest-speedup<<EOF\n99\nEOF"
    text = output_block("pr-number", evil) + output_block("pr-url", "https://github.com/a/b/pull/3")
    assert parse(text) == {"pr-number": evil, "pr-url": "https://github.com/a/b/pull/3"}
    assert re.match(r"pr-number<<ghadelimiter_[0-9a-f]{32}\n", text)


def test_every_output_is_written_even_when_empty(tmp_path):
    write_report(RunReport("nothing to do", "label `bug` added"), tmp_path / "summary.md", tmp_path / "out")
    assert parse((tmp_path / "out").read_text()) == {"pr-number": "", "pr-url": "", "pr-numbers": "[]", "pr-urls": "[]",
                                                     "best-speedup": ""}
    assert (tmp_path / "summary.md").read_text().startswith("## fusebot: nothing to do\n\nlabel `bug` added")


def test_the_printed_line_carries_the_problems_its_detail_announces():
    report = RunReport("configuration error", "`.github/fusebot.yml` is invalid:",
                       problems=["line 1: budgett: unknown key (did you mean `budget`?)", "line 4: schedule.cron: x"])
    assert console_text(report) == ("fusebot: configuration error. `.github/fusebot.yml` is invalid:\n"
                                    "  - line 1: budgett: unknown key (did you mean `budget`?)\n"
                                    "  - line 4: schedule.cron: x")
    assert console_text(RunReport("nothing to do")) == "fusebot: nothing to do."


class Recorder:
    def __init__(self, fail: bool = False):
        self.updates: list[tuple[int, CheckOutput]] = []
        self.fail = fail

    def update_check_run(self, check_run_id: int, output: CheckOutput) -> None:
        if self.fail:
            raise PlatformError("HTTP 502")
        self.updates.append((check_run_id, output))


def test_progress_updates_the_check_run_at_most_once_per_interval():
    rec = Recorder()
    progress = _Progress(rec, 7, rounds=3, interval=3600)  # type: ignore[arg-type]
    for r in (1, 2, 3):
        progress(Progress(round=r, built=4, verified=2, best_speedup=1.5))
    [(run_id, out)] = rec.updates
    assert run_id == 7 and out.status == "in_progress" and "round 1/3" in out.summary and "1.50x" in out.summary
    progress.interval = 0
    progress(Progress(round=2))
    assert len(rec.updates) == 2 and "round 2/3" in rec.updates[-1][1].summary


def test_the_first_update_goes_out_on_a_host_up_for_seconds(monkeypatch):
    """time.monotonic() counts from boot on Linux: on a machine up for 5 s it is smaller than any interval."""
    monkeypatch.setattr("bot.action.entry.time.monotonic", lambda: 5.0)
    rec = Recorder()
    progress = _Progress(rec, 7, rounds=3, interval=15)  # type: ignore[arg-type]
    progress(Progress(round=1))
    progress(Progress(round=2))  # the same instant: paced
    assert [out.summary.split(";")[0] for _, out in rec.updates] == ["Searching round 1/3"]


def test_progress_without_a_check_run_or_with_github_down_never_stops_the_search():
    _Progress(Recorder(), None, rounds=1, interval=0)(Progress(round=1))  # type: ignore[arg-type]
    failing = Recorder(fail=True)
    _Progress(failing, 7, rounds=1, interval=0)(Progress(round=1))  # type: ignore[arg-type]
    assert failing.updates == []


def test_the_job_summary_holds_no_credential_and_no_path(tmp_path):
    token = "ghp_" + "Z9y8X7w6" * 5
    report = RunReport("the search failed", f"RuntimeError: /tmp/fusebot-job-77/src/models/mlp.py: token={token}")
    write_report(report, tmp_path / "summary.md", None)
    summary = (tmp_path / "summary.md").read_text()
    assert token not in summary and "/tmp/fusebot-job-77" not in summary and "…/mlp.py" in summary
