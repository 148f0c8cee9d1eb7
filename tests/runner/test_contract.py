import json
from pathlib import Path

from runner.contract import REASON_NAMES, Verdict

DOCS = Path(__file__).parents[2] / "docs"


def test_published_verdict_schema_is_current():
    committed = json.loads((DOCS / "verdict.schema.json").read_text())
    assert committed == Verdict.model_json_schema(), "regenerate docs/verdict.schema.json"


def test_every_reason_name_is_documented():
    doc = (DOCS / "eval.md").read_text()
    missing = [r for r in REASON_NAMES if f"`{r}`" not in doc]
    assert not missing, missing
