"""Discovery: a pinned shallow clone from a real (bare, local) git repository, markers and config targets."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from bot.repo.config import ConfigError, load_config
from bot.repo.discovery import (
    CloneError,
    SourceProblem,
    check_config_targets,
    checkout_cached,
    clone_at,
    discover,
    find_targets,
    make_tarball,
    marked_classes,
    marked_targets,
)
from runner.contract import TargetSpec
from tests.bot.helpers import MODULE, GitRepo, git, initial_files


@pytest.fixture
def repo(tmp_path):
    r = GitRepo.create(tmp_path / "remote", "owner/name")
    r.first = r.commit(initial_files(), "one")
    r.second = r.commit({"models/new.py": MODULE.format(cls="NewOp", extra="")}, "two")
    return r


def test_clone_pins_an_older_sha_and_keeps_no_credentials(repo, tmp_path):
    dest = clone_at(f"file://{repo.bare}", repo.first, tmp_path / "c")
    assert git(dest, "rev-parse", "HEAD") == repo.first  # not the branch head (second)
    assert not (dest / "models/new.py").exists()
    assert git(dest, "rev-list", "--count", "HEAD") == "1"  # shallow
    assert "file://" not in (dest / ".git" / "config").read_text()  # the URL (token) is not stored


def test_clone_of_unknown_sha_is_a_clone_error_without_the_url(repo, tmp_path):
    url = f"file://{repo.bare}?x-access-token=SECRETSECRET"
    with pytest.raises(CloneError) as e:
        clone_at(url, "0" * 40, tmp_path / "c")
    assert "SECRETSECRET" not in str(e.value)


def test_checkout_cache_reuses(repo, tmp_path):
    a = checkout_cached(f"file://{repo.bare}", repo.second, tmp_path / "cache")
    (a / "marker").write_text("x")
    b = checkout_cached(f"file://{repo.bare}", repo.second, tmp_path / "cache")
    assert a == b and (b / "marker").exists()


def test_markers():
    src = MODULE.format(cls="A", extra="")
    assert marked_classes(src) == ["A"]
    # the marker must sit directly above the class (or its decorators)
    assert marked_classes(src.replace("# fusebot: optimize\n", "# fusebot: optimize\n\n")) == []
    decorated = src.replace("# fusebot: optimize\nclass", "# fusebot: optimize\n@dataclass\nclass")
    assert marked_classes(decorated) == ["A"]
    # KernelBench style: the input factories must be beside it
    assert marked_classes(src.replace("def get_init_inputs", "def other")) == []
    assert marked_classes("this is not python (") == []
    assert marked_classes(src.replace("# fusebot: optimize", "# FuseBot: Optimize")) == ["A"]  # any case


def test_discover_markers_config_changed_and_ignore(repo, tmp_path):
    wt = clone_at(f"file://{repo.bare}", repo.second, tmp_path / "c")
    names = [t.name for t in discover(wt, [])]
    assert names == ["models.attn.Attention", "models.mlp.MLP", "models.new.NewOp"]
    cfg = load_config(
        "targets:\n  - file: models/plain.py\n    class: Plain\n    shapes: [[4, 4]]\nignore: [models/mlp.py]\n"
    )
    targets = discover(wt, cfg.targets, ignore=cfg.ignore)
    assert [t.name for t in targets] == ["models.plain.Plain", "models.attn.Attention", "models.new.NewOp"]
    assert targets[0].input_shapes == [[4, 4]]
    changed = discover(wt, cfg.targets, ignore=cfg.ignore, changed_files=["models/new.py", "README.md"])
    assert [t.name for t in changed] == ["models.new.NewOp"]
    assert discover(wt, [], markers=False) == []


def test_tarball_has_the_tree_but_not_git(repo, tmp_path):
    wt = clone_at(f"file://{repo.bare}", repo.first, tmp_path / "c")
    tar = make_tarball(wt, tmp_path / "out" / "src.tar.gz")
    with tarfile.open(tar) as t:
        names = set(t.getnames())
    assert "models/attn.py" in names and "README.md" in names
    assert not any(n.startswith(".git") for n in names)


def test_a_marked_modules_second_shape_is_part_of_its_target(tmp_path):
    """`get_second_inputs()` beside a marked class (examples/row_gain.py) is verified too, as the demo does: the
    App and the Action must not drop the shape that catches kernels with sizes baked in."""
    examples = Path(__file__).resolve().parents[3] / "examples"
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "row_gain.py").write_text((examples / "row_gain.py").read_text())
    (tmp_path / "models" / "attn.py").write_text(MODULE.format(cls="Attention", extra=""))
    targets = {t.class_name: t for t in discover(tmp_path, [])}
    assert targets["RowGain"] == TargetSpec(name="models.row_gain.RowGain", file="models/row_gain.py",
                                            class_name="RowGain", second_inputs="get_second_inputs")
    assert targets["Attention"].second_inputs is None  # no second factory, no second shape


def test_marked_files_that_cannot_be_used_are_problems_at_their_own_line(tmp_path):
    (tmp_path / "models").mkdir()
    good = MODULE.format(cls="Attention", extra="")
    (tmp_path / "models" / "attn.py").write_text(good)
    (tmp_path / "models" / "typo.py").write_text(good.replace("class Attention(nn.Module):", "class Typo(nn.Module)"))
    (tmp_path / "models" / "bare.py").write_text("# fusebot: optimize\nclass Bare:\n    pass\n")
    found = find_targets(tmp_path, [])
    assert [t.name for t in found.targets] == ["models.attn.Attention"]
    typo_line = good.splitlines().index("class Attention(nn.Module):") + 1
    assert found.problems == [
        SourceProblem("models/bare.py", 2, "marked `# fusebot: optimize`, but the module defines no get_inputs() and "
                                           "get_init_inputs()"),
        SourceProblem("models/typo.py", typo_line, "syntax error: expected ':'")]
    only_attn = find_targets(tmp_path, [], changed_files=["models/attn.py"])  # a PR that does not touch them
    assert only_attn.problems == [] and [t.file for t in only_attn.targets] == ["models/attn.py"]
    # a config target whose file does not parse is reported the same way, at the file's line
    cfg = load_config("targets:\n  - file: models/typo.py\n    class: Typo\n", "cfg.yml")
    assert find_targets(tmp_path, cfg.targets, markers=False).problems[0].path == "models/typo.py"


def test_config_targets_are_checked_against_the_code_at_the_configs_line(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "attn.py").write_text(MODULE.format(cls="Attention", extra=""))
    text = ("version: 1\ntargets:\n  - file: models/attn.py\n    class: Attention\n"
            "  - file: models/attn.py\n    class: Atention\n  - file: models/gone.py\n    class: Gone\n")
    with pytest.raises(ConfigError) as e:
        check_config_targets(tmp_path, load_config(text), text)
    assert [(p.path, p.line, p.message) for p in e.value.problems] == [
        (".github/fusebot.yml", 6, "targets.1.class: models/attn.py defines no class Atention"),
        (".github/fusebot.yml", 7, "targets.2.file: models/gone.py does not exist at this commit")]
    check_config_targets(tmp_path, load_config(text.split("  - file: models/attn.py\n    class: Atention")[0]), text)


def test_the_demos_targets_are_named_by_their_class_and_skip_fusebots_kernels(tmp_path):
    (tmp_path / "examples").mkdir()
    (tmp_path / "fusebot_kernels" / "attention").mkdir(parents=True)
    (tmp_path / "examples" / "attn.py").write_text(MODULE.format(cls="Attention", extra=""))
    (tmp_path / "fusebot_kernels" / "attention" / "dropin.py").write_text(MODULE.format(cls="Copy", extra=""))
    assert [(t.name, t.file) for t in marked_targets(tmp_path)] == [("Attention", "examples/attn.py")]
