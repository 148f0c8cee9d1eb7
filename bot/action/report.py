"""What a run of the Action leaves behind in the workflow: the job summary (markdown) and the step's outputs.

Pure text first (`summary_markdown`, `output_block`), then two appends to the files GitHub names in
`GITHUB_STEP_SUMMARY` and `GITHUB_OUTPUT`. Outputs use GitHub's multiline form (`name<<DELIMITER`, the value, the
delimiter) with a random delimiter that does not occur in the value, so no value can forge another output.

The outputs' contract (action.yml and the README say the same): with per-target grouping one run can open or update
several PRs. `pr-number` and `pr-url` name the first of them (in the order of the job's targets), for the common
one-PR case and for `if: steps.x.outputs.pr-url != ''`; `pr-numbers` and `pr-urls` list all of them as JSON arrays
(`[]` when none) for `fromJSON()`; `best-speedup` is the best over every improved target, whichever PR it is in.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from bot.publish.propose import Published
from bot.publish.text import scrub
from bot.publish.verdicts import environment_line, speedup, target_table, verdict_line
from runner.contract import Environment, TargetResult

OUTPUTS = ("pr-number", "pr-url", "pr-numbers", "pr-urls", "best-speedup")


@dataclass
class RunReport:
    """One run of the Action, as the summary and the outputs tell it."""

    title: str
    detail: str = ""
    results: list[TargetResult] = field(default_factory=list)
    environment: Environment | None = None
    published: list[Published] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    attachment: str = ""  # e.g. a fork's results and patch when they could not be commented

    def pulls(self) -> list[tuple[int, str]]:
        return [(p.pull_request.number, p.pull_request.url) for p in self.published if p.pull_request is not None]

    def best_speedup(self) -> float | None:
        found = [speedup(r.verdict) for r in self.results if r.improved and r.verdict is not None]
        found = [s for s in found if s is not None]
        return max(found) if found else None

    def outputs(self) -> dict[str, str]:
        pulls = self.pulls()
        best = self.best_speedup()
        values = {
            "pr-number": str(pulls[0][0]) if pulls else "",
            "pr-url": pulls[0][1] if pulls else "",
            "pr-numbers": json.dumps([number for number, _ in pulls]),
            "pr-urls": json.dumps([url for _, url in pulls]),
            "best-speedup": f"{best:.4g}" if best is not None else "",
        }
        return {name: values[name] for name in OUTPUTS}


def summary_markdown(report: RunReport) -> str:
    lines = [f"## fusebot: {report.title}", ""]
    if report.detail:
        lines += [report.detail, ""]
    for problem in report.problems:
        lines.append(f"- {problem}")
    if report.problems:
        lines.append("")
    results = report.results
    if results:
        lines += [verdict_line(results), ""]
    for number, url in report.pulls():
        lines.append(f"- Pull request [#{number}]({url})")
    forks = [p for p in report.published if p.pull_request is None and p.conclusion != "neutral"]
    if forks:
        lines.append("- Results and a patch were posted as a comment on the pull request (a fork: nothing pushed).")
    if report.pulls() or forks:
        lines.append("")
    for r in results:
        lines += [target_table(r), ""]
    if report.environment is not None:
        lines += [environment_line(report.environment), ""]
    if report.attachment:
        lines += ["<details><summary>Results and patch for the pull request</summary>", "", report.attachment, "",
                  "</details>", ""]
    return scrub("\n".join(lines))  # the run's page is as public as the repository: no credential, no path


def console_text(report: RunReport) -> str:
    """What the step prints at its end: the title and detail, then each problem (a detail that ends with a colon
    announces them), so the log says what is wrong and not only the annotations do."""
    lines = [f"fusebot: {report.title}. {report.detail}".strip()]
    lines += [f"  - {problem}" for problem in report.problems]
    return scrub("\n".join(lines))


def output_block(name: str, value: str) -> str:
    """Always the multiline form: safe whatever the value holds."""
    delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
    while delimiter in value:
        delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
    return f"{name}<<{delimiter}\n{value}\n{delimiter}\n"


def write_report(report: RunReport, summary_file: Path | None, output_file: Path | None) -> None:
    """Append the summary and the outputs (every declared output, empty when there is nothing to say)."""
    if summary_file is not None:
        with summary_file.open("a", encoding="utf-8") as f:
            f.write(summary_markdown(report) + "\n")
    if output_file is not None:
        with output_file.open("a", encoding="utf-8") as f:
            for name, value in report.outputs().items():
                f.write(output_block(name, value))
