"""A pull request's branch names: `fusebot/<base>/<group>`, the group slugged; a marker's key without spaces."""

from __future__ import annotations

import pytest

from bot.github.platform import marker
from bot.publish.plan import branch_name


@pytest.mark.parametrize(("base", "group", "branch"), [("main", "examples", "fusebot/main/examples"),
                                                        ("feature/x", "My Group!", "fusebot/feature/x/my-group")])
def test_branch_names(base, group, branch):
    assert branch_name(base, group) == branch
    with pytest.raises(ValueError):
        marker("pr", "a b")
