import json
import re
from pathlib import Path

from runner.contract import EXIT_STATUS, REASON_NAMES, ExitStatus, Verdict

DOCS = Path(__file__).parents[2] / "docs"
EXIT_ROW = re.compile(r"^\| `(\d+)` \| (.+) \|$", re.M)


def test_published_verdict_schema_is_current():
    committed = json.loads((DOCS / "verdict.schema.json").read_text())
    assert committed == Verdict.model_json_schema(), "regenerate docs/verdict.schema.json"


def test_every_reason_name_is_documented():
    doc = (DOCS / "eval.md").read_text()
    missing = [r for r in REASON_NAMES if f"`{r}`" not in doc]
    assert not missing, missing


def test_the_exit_statuses_are_documented_once_as_the_table_says():
    """One table for every command: docs/exit-status.md is it, row for row; no other page keeps a table of its own."""
    rows = EXIT_ROW.findall((DOCS / "exit-status.md").read_text())
    assert {int(k): v for k, v in rows} == EXIT_STATUS
    assert [int(k) for k, _ in rows] == [int(s) for s in ExitStatus] == [0, 1, 2, 3, 130]
    others = [p.name for p in DOCS.glob("*.md") if p.name != "exit-status.md" and "| exit status |" in p.read_text()]
    assert others == []
