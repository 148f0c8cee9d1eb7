"""docs/config.md is generated from the published JSON Schema, and the committed page is the generator's output."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

from bot.repo import config_docs
from bot.repo.config import json_schema_text

SCHEMA = json.loads(config_docs.SCHEMA.read_text())


def test_the_committed_page_is_the_generators_output():
    assert config_docs.SCHEMA.read_text() == json_schema_text()  # the schema itself is current (bot/repo/config.py)
    assert config_docs.DOC.read_text() == config_docs.render(SCHEMA), "run `python -m bot.repo.config_docs`"


def test_every_key_of_every_section_is_documented_with_its_type_and_default():
    doc = config_docs.render(SCHEMA)
    sections = {"Top level": SCHEMA, **SCHEMA["$defs"]}
    for title, section in sections.items():
        body = doc.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
        for key in section["properties"]:
            [row] = [line for line in body.splitlines() if line.startswith(f"| `{key}`")]
            assert row.count("|") >= 5
    assert "| `trigger_label` | string | `\"optimize-kernels\"` |" in doc
    assert "| `class` (required) | string |" in doc
    assert "| `pr_grouping` | `\"per-target\"` \\| `\"single\"` | `\"per-target\"` |" in doc
    assert "list of [TargetConfig](#targetconfig)" in doc


def test_a_new_field_in_the_schema_changes_the_page():
    schema = copy.deepcopy(SCHEMA)
    schema["properties"]["max_prs"] = {"type": "integer", "default": 5, "minimum": 1, "description": "At most."}
    assert "| `max_prs` | integer | `5` | At most.; ≥ 1 |" in config_docs.render(schema)


def test_check_mode_reports_a_stale_page(tmp_path, monkeypatch):
    assert subprocess.run([sys.executable, "-m", "bot.repo.config_docs", "--check"], cwd=config_docs.ROOT).returncode == 0
    stale = tmp_path / "config.md"
    stale.write_text("# old\n")
    monkeypatch.setattr(config_docs, "DOC", stale)
    assert config_docs.main(["--check"]) == 1
    assert config_docs.main([]) == 0 and stale.read_text() == config_docs.render(SCHEMA)
