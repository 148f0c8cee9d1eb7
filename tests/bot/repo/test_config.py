"""`.github/fusebot.yml`: defaults, the published schema, and errors that point at file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from bot.repo.config import CONFIG_PATH, ConfigError, FusebotConfig, json_schema, load_config

SCHEMA_FILE = Path(__file__).resolve().parents[3] / "bot" / "schema" / "fusebot-config.schema.json"

FULL = """\
version: 1
trigger_label: speed-me-up
targets:
  - file: models/attn.py
    class: Attention
    inputs: make_inputs
    tolerance: {atol: 0.001, rtol: 0.001}
  - file: models/norm.py
    class: RMSNorm
    shapes: [[8, 4096]]
    dtype: bfloat16
    init_args: [4096]
schedule:
  cron: "30 2 * * 1-5"
  timezone: Europe/Berlin
budget:
  rounds: 5
  wall_seconds: 600
models: [gpt-x]
kernels_dir: kernels/fused
pr_grouping: single
ignore: ["third_party/*"]
"""


def test_committed_schema_is_the_models_schema():
    assert json.loads(SCHEMA_FILE.read_text()) == json_schema(), "run: python -c 'from bot.repo.config import ...'"


def test_full_example_valid_against_model_and_published_schema():
    import yaml

    cfg = load_config(FULL)
    assert cfg.trigger_label == "speed-me-up"
    assert cfg.targets[1].shapes == [[8, 4096]] and cfg.targets[1].dtype == "bfloat16"
    assert cfg.schedule.timezone == "Europe/Berlin" and cfg.budget.rounds == 5
    errors = list(Draft202012Validator(json_schema()).iter_errors(yaml.safe_load(FULL)))
    assert errors == []


def test_no_file_means_defaults():
    assert load_config(None) == FusebotConfig()
    assert load_config("") == FusebotConfig()
    assert load_config(None).trigger_label == "optimize-kernels" and load_config(None).markers


@pytest.mark.parametrize(
    "text, line, fragment",
    [
        ("targets:\n  - file: a.py\n    class: 9Lives\n", 3, "not a Python class name"),
        ("schedule:\n  cron: every night\n", 2, "cron"),
        ("schedule:\n  timezone: Mars/Olympus\n", 2, "IANA"),
        ("version: 1\nbudget:\n  rounds: lots\n", 3, "budget.rounds"),
        ("version: 1\n\nunknown_key: 1\n", 3, "unknown_key"),
        ("targets:\n  - file: ../../etc/passwd.py\n    class: A\n", 2, "relative path"),
        ("targets:\n  - file: a.py\n    class: A\n    inputs: f\n    shapes: [[1]]\n", 2, "not both"),
        ("targets: [\n", 2, "YAML syntax error"),
        ("- just\n- a list\n", 1, "mapping"),
    ],
)
def test_errors_point_at_the_line(text, line, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(text)
    problem = e.value.problems[0]
    assert problem.path == CONFIG_PATH
    assert problem.line == line, problem
    assert fragment in problem.message


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("budgett:\n  rounds: 1\n", 2, "budgett: unknown key (did you mean `budget`?)"),
        ("budget:\n  roundz: 1\n", 2, "budget.roundz: unknown key (did you mean `rounds`?)"),
        ("schedule: {cronn: '0 4 * * *'}\n", 1, "schedule.cronn: unknown key (did you mean `cron`?)"),
        ("targets:\n  - file: a.py\n    class: A\n    tolerance: {atoll: 1}\n", 4,
         "targets.0.tolerance.atoll: unknown key (did you mean `atol`?)"),
        ("targets:\n  - file: a.py\n    class: A\n    init_arg: [1]\n", 4,
         "targets.0.init_arg: unknown key (did you mean `init_args`?)"),
    ],
)
def test_an_unknown_key_names_the_nearest_valid_key_at_its_level(text, line, message):
    with pytest.raises(ConfigError) as e:
        load_config(text)
    [problem] = e.value.problems
    assert (problem.line, problem.message) == (line, message)


def test_an_unknown_key_far_from_every_valid_one_lists_the_valid_keys():
    with pytest.raises(ConfigError) as e:
        load_config("targets:\n  - file: a.py\n    class: A\n    zzz: 1\n")
    [problem] = e.value.problems
    assert problem.message.startswith("targets.0.zzz: unknown key (valid keys here: `class`, `dtype`, `file`,")
    assert "class_name" not in problem.message  # the YAML spelling, not the model's field name
