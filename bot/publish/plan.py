"""What a fusebot pull request is made of (`PullRequestPlan`: the repository, the base, the target group, the results)
and the names it goes by: its branch `fusebot/<base>/<group>` and its key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from runner.contract import Environment, TargetResult


def _slug(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z._-]+", "-", text).strip("-.").lower() or "all"


def branch_name(base: str, group: str) -> str:
    """One branch per base branch and target group: `fusebot/<base>/<group>`."""
    return f"fusebot/{base.strip('/')}/{_slug(group)}"


def pr_key(base: str, group: str) -> str:
    return f"{base.strip('/')}/{_slug(group)}"


@dataclass
class PullRequestPlan:
    """Everything a fusebot PR says. `source_pr` is the labelled PR it answers (None: nightly or demo)."""

    repo: str
    base: str
    group: str
    commit: str
    results: list[TargetResult]
    environment: Environment | None = None
    kernels_dir: str = "fusebot_kernels"
    source_pr: int | None = None
    trigger: str = "label"
    job_id: str | None = None  # the job whose results these are (`/fusebot explain` and `rerun` find it by marker)
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def branch(self) -> str:
        return branch_name(self.base, self.group)

    @property
    def key(self) -> str:
        return pr_key(self.base, self.group)

    @property
    def improved(self) -> list[TargetResult]:
        return [r for r in self.results if r.improved]
