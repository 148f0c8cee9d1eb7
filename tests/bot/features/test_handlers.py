"""Triggers and their security rules, driven by GitHub's real payload examples posted (signed) to the real app,
against the fake GitHub (every request checked against GitHub's OpenAPI description)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from bot.features.commands import BOT_PR_COMMANDS, COMMANDS, HANDLERS, HELP, PREFIX, parse_command
from bot.features.status import STATUS_MARKER
from tests.bot.helpers import INSTALLATION, MODULE, REPO, comment_payload, example, initial_files, pr_payload
from tests.fakes.github_server import Pull

LABEL = "optimize-kernels"


def label_event(world, *, number=2, sha=None, sender="maintainer", label=LABEL, fork=False, head_ref="feature"):
    sha = sha or world.shas["feature"]
    return pr_payload("labeled", number=number, head_sha=sha, base_sha=world.shas["main"], label=label,
                      sender=sender, fork=fork, head_ref=head_ref)


def check_runs(world, name="fusebot"):
    return [r for r in world.fake.check_runs.values() if r["name"] == name]


# ---- the label ---------------------------------------------------------------------------------------------


def test_label_by_writer_queues_one_job_pinned_to_head(world):
    r = world.post("pull_request", label_event(world), delivery="label-1")
    assert r.status_code == 202 and r.json() == {"queued": True, "duplicate": False}
    world.drain()
    [job] = world.jobs()
    assert (job.repo, job.pr_number, job.sha, job.trigger) == (REPO, 2, world.shas["feature"], "label")
    assert [t.name for t in job.spec.targets] == ["models.attn.Attention"]  # only what the PR changed
    [run] = check_runs(world)
    assert run["head_sha"] == world.shas["feature"] and run["status"] == "queued" and run["external_id"] == job.id
    assert [a["identifier"] for a in run["actions"]] == ["stop"]  # the button that arrives as requested_action
    assert world.fake.calls_to("GET", "/collaborators/maintainer/permission")


def test_replayed_delivery_is_ignored(world):
    event = label_event(world)
    assert world.post("pull_request", event, delivery="same-id").status_code == 202
    world.drain()
    again = world.post("pull_request", event, delivery="same-id")
    assert again.status_code == 200 and again.json()["duplicate"] is True
    world.drain()
    assert len(world.jobs()) == 1


def test_label_from_read_only_user_is_ignored(world):
    world.post("pull_request", label_event(world, sender="reader"))
    world.drain()
    assert world.jobs() == [] and check_runs(world) == []
    assert world.fake.calls_to("GET", "/collaborators/reader/permission")


def test_other_labels_are_ignored_without_asking_github_for_permission(world):
    world.post("pull_request", label_event(world, label="bug"))
    world.drain()
    assert world.jobs() == [] and not world.fake.calls_to("GET", "/permission")


def test_trigger_label_comes_from_the_repository_config(world):
    main = world.repo.commit({".github/fusebot.yml": "trigger_label: go-fast\n"}, "config", branch="main")
    world.shas["main"] = main
    world.post("pull_request", label_event(world, label=LABEL))
    world.post("pull_request", label_event(world, label="go-fast"))
    world.drain()
    assert [j.trigger for j in world.jobs()] == ["label"]


def test_fork_pr_new_commits_wait_for_a_writer_to_relabel(world):
    fork_a = world.repo.commit({"models/mlp.py": MODULE.format(cls="MLP", extra=" * 2")}, "fork 1", branch="fork")
    world.repo.push_ref(fork_a, "refs/pull/3/head")
    pull = world.fake.add_pull(Pull(REPO, 3, fork_a, "patch-1", "forker/Hello-World", "main", world.shas["main"]))
    world.post("pull_request", label_event(world, number=3, sha=fork_a, fork=True, head_ref="patch-1"))
    world.drain()
    [first] = world.jobs()
    assert first.sha == fork_a and [t.name for t in first.spec.targets] == ["models.mlp.MLP"]

    fork_b = world.repo.commit({"models/mlp.py": MODULE.format(cls="MLP", extra=" * 3")}, "fork 2", branch="fork")
    world.repo.push_ref(fork_b, "refs/pull/3/head")
    pull.head_sha = fork_b
    sync = pr_payload("synchronize", number=3, head_sha=fork_b, base_sha=world.shas["main"], labels=[LABEL],
                      sender="forker", fork=True, head_ref="patch-1")
    world.post("pull_request", sync)
    world.drain()
    assert [j.sha for j in world.jobs()] == [fork_a]  # not run
    waiting = [r for r in check_runs(world) if r["head_sha"] == fork_b]
    assert waiting and waiting[0]["conclusion"] == "neutral" and "write access" in waiting[0]["output"]["summary"]

    world.post("pull_request", label_event(world, number=3, sha=fork_b, fork=True, head_ref="patch-1"))
    world.drain()
    assert [j.sha for j in world.jobs()] == [fork_a, fork_b]


def test_same_repo_labelled_pr_runs_new_commits(world):
    newer = world.repo.commit({"models/attn.py": MODULE.format(cls="Attention", extra=" + 1")}, "more",
                              branch="feature")
    world.fake.pulls[(REPO, 2)].head_sha = newer
    sync = pr_payload("synchronize", number=2, head_sha=newer, base_sha=world.shas["main"], labels=[LABEL])
    world.post("pull_request", sync)
    world.drain()
    assert [j.sha for j in world.jobs()] == [newer]


def test_closed_pr_cancels_its_jobs(world):
    world.post("pull_request", label_event(world))
    world.drain()
    closed = pr_payload("closed", number=2, head_sha=world.shas["feature"], base_sha=world.shas["main"],
                        state="closed")
    world.post("pull_request", closed)
    world.drain()
    assert [j.state for j in world.jobs()] == ["cancelled"]
    assert check_runs(world)[0]["conclusion"] == "cancelled"


# ---- config errors -----------------------------------------------------------------------------------------


def test_config_error_is_a_failing_check_run_with_an_annotation(world):
    bad = "version: 1\ntargets:\n  - file: models/attn.py\n    class: not-a-class\n"
    sha = world.repo.commit({".github/fusebot.yml": bad}, "bad config", branch="feature")
    world.fake.pulls[(REPO, 2)].head_sha = sha
    world.post("pull_request", label_event(world, sha=sha))
    world.drain()
    assert world.jobs() == []
    [run] = check_runs(world, "fusebot config")
    assert run["conclusion"] == "failure" and run["head_sha"] == sha
    [ann] = run["output"]["annotations"]
    assert ann["path"] == ".github/fusebot.yml" and ann["start_line"] == 4 and "class name" in ann["message"]


def test_a_config_target_naming_a_missing_class_fails_at_the_configs_line_before_any_job(world):
    config = "version: 1\ntargets:\n  - file: models/attn.py\n    class: Atention\n"
    sha = world.repo.commit({".github/fusebot.yml": config}, "config", branch="feature")
    world.fake.pulls[(REPO, 2)].head_sha = sha
    world.post("pull_request", label_event(world, sha=sha))
    world.drain()
    assert world.jobs() == []
    [run] = check_runs(world, "fusebot config")
    assert run["conclusion"] == "failure" and check_runs(world) == []
    [ann] = run["output"]["annotations"]
    assert (ann["path"], ann["start_line"]) == (".github/fusebot.yml", 4)
    assert ann["message"] == "targets.0.class: models/attn.py defines no class Atention"


def test_a_marked_file_with_a_syntax_error_is_reported_at_its_line(world):
    broken = initial_files()["models/attn.py"].replace("def get_inputs():", "def get_inputs(:")
    sha = world.repo.commit({"models/attn.py": broken}, "typo", branch="feature")
    world.fake.pulls[(REPO, 2)].head_sha = sha
    world.post("pull_request", label_event(world, sha=sha))
    world.drain()
    assert world.jobs() == []
    [run] = check_runs(world)
    assert run["conclusion"] == "failure" and run["output"]["title"] == "Marked files need fixing"
    assert "No marked targets" not in run["output"]["summary"]
    [ann] = run["output"]["annotations"]
    line = broken.splitlines().index("def get_inputs(:") + 1
    assert (ann["path"], ann["start_line"]) == ("models/attn.py", line) and ann["message"].startswith("syntax error")
    assert "/tmp" not in run["output"]["summary"] and str(world.settings.data_dir) not in run["output"]["summary"]


@pytest.mark.parametrize("text, conclusion", [("schedule:\n  cron: '0 4 * * *'\n", "success"),
                                              ("schedule:\n  cron: sometimes\n", "failure")])
def test_pr_changing_the_config_gets_it_validated(world, text, conclusion):
    sha = world.repo.commit({".github/fusebot.yml": text}, "config", branch="feature")
    world.fake.pulls[(REPO, 2)].head_sha = sha
    world.post("pull_request", pr_payload("opened", number=2, head_sha=sha, base_sha=world.shas["main"]))
    world.drain()
    [run] = check_runs(world, "fusebot config")
    assert run["conclusion"] == conclusion and world.jobs() == []


# ---- comment commands --------------------------------------------------------------------------------------


def command(world, body, *, sender="maintainer", comment_id=555):
    world.fake.add_comment(REPO, 2, comment_id, body, sender)
    r = world.post("issue_comment", comment_payload(body, number=2, comment_id=comment_id, sender=sender))
    assert r.status_code == 202
    world.drain()


def reactions(world):
    return [r["content"] for r in world.fake.reactions]


def test_parse_command():
    assert parse_command("/fusebot run") .name == "run"
    assert parse_command("LGTM\n/fusebot   run   ALL\n").name == "run-all"
    assert parse_command("/fusebot dance").name == "unknown"
    assert parse_command("please /fusebot run") is None and parse_command("nothing") is None


def test_run_and_run_all(world):
    command(world, "/fusebot run", comment_id=1)
    command(world, "/fusebot run all", comment_id=2)
    runs = world.jobs()
    assert [j.trigger for j in runs] == ["comment", "comment"]
    assert [len(j.spec.targets) for j in runs] == [1, 2] and {j.sha for j in runs} == {world.shas["feature"]}
    assert reactions(world) == ["+1", "+1"]


def test_stop_status_help_unknown(world):
    command(world, "/fusebot run", comment_id=1)
    command(world, "/fusebot status", comment_id=2)
    command(world, "/fusebot stop", comment_id=3)
    command(world, "/fusebot help", comment_id=4)
    command(world, "/fusebot explode", comment_id=5)
    assert [j.state for j in world.jobs()] == ["cancelled"]
    status, stopped, helped, unknown = world.fake.comments_on(REPO, 2)
    assert status.startswith(STATUS_MARKER) and "queued" in status
    assert stopped == "Cancelled 1 fusebot job(s) on this pull request."
    assert helped == HELP and unknown.startswith("Unknown command `/fusebot explode`") and HELP in unknown
    assert reactions(world) == ["+1", "+1", "+1", "+1", "confused"]


def test_fork_pr_command_runs_only_what_the_commenter_saw(world):
    fork = world.repo.commit({"models/mlp.py": MODULE.format(cls="MLP", extra=" * 2")}, "fork", branch="fork")
    world.repo.push_ref(fork, "refs/pull/3/head")
    pull = world.fake.add_pull(Pull(REPO, 3, fork, "patch-1", "forker/Hello-World", "main", world.shas["main"]))

    def comment(body: str, comment_id: int) -> None:
        world.fake.add_comment(REPO, 3, comment_id, body, "maintainer")
        payload = comment_payload(body, number=3, comment_id=comment_id)  # created 2019-05-15T15:20:18Z
        world.post("issue_comment", payload)
        world.drain()

    pull.updated_at = "2019-05-15T15:20:30Z"  # a push after the command was written
    comment("/fusebot run", 11)
    assert world.jobs() == []
    assert "changed after `/fusebot run`" in world.fake.comments_on(REPO, 3)[0]
    pull.updated_at = "2019-05-15T15:20:00Z"  # unchanged since
    comment("/fusebot run", 12)
    [job] = world.jobs()
    assert job.sha == fork and [t.name for t in job.spec.targets] == ["models.mlp.MLP"]


def test_command_from_non_collaborator_is_ignored(world):
    command(world, "/fusebot run all", sender="stranger")
    assert world.jobs() == [] and reactions(world) == [] and world.fake.comments_on(REPO, 2) == []


def test_comments_on_issues_and_plain_comments_are_ignored(world):
    issue = example("issue_comment.created.with-installation")  # an issue, not a pull request
    issue["comment"]["body"] = "/fusebot run all"
    world.post("issue_comment", issue)
    command(world, "thanks, looks good")
    assert world.jobs() == [] and reactions(world) == [] and not world.fake.calls_to("GET", "/permission")


# ---- check runs and installations --------------------------------------------------------------------------


def test_check_run_rerequested_and_stop_action(world):
    world.post("pull_request", label_event(world))
    world.drain()
    [job] = world.jobs()
    run_id = job.check_run_id
    assert run_id is not None
    ev = copy.deepcopy(example("check_run.rerequested"))
    ev["check_run"]["id"], ev["repository"]["full_name"] = run_id, REPO
    ev["installation"]["id"], ev["sender"]["login"] = INSTALLATION, "maintainer"
    world.post("check_run", ev)
    world.drain()
    first, second = world.jobs()
    assert second.sha == first.sha and second.spec.targets == first.spec.targets and second.id != first.id

    stop = copy.deepcopy(example("check_run.requested_action"))
    stop["check_run"]["id"], stop["repository"]["full_name"] = run_id, REPO
    stop["installation"]["id"], stop["sender"]["login"] = INSTALLATION, "maintainer"
    stop["requested_action"]["identifier"] = "stop"
    world.post("check_run", stop)
    stop_by_reader = copy.deepcopy(stop)
    stop_by_reader["sender"]["login"] = "reader"
    world.post("check_run", {**stop_by_reader, "requested_action": {"identifier": "rerun"}})
    world.drain()
    assert [j.state for j in world.jobs()] == ["cancelled", "queued"]


def test_installation_events_maintain_the_repository_list(world):
    world.post("installation", example("installation.created"))
    world.post("installation_repositories", example("installation_repositories.added"))
    world.drain()
    repos = {r.full_name: r.installation_id for r in world.ctx.store.repos()}
    assert repos == {"Codertocat/Hello-World": 957387, "Codertocat/Space": 957387}
    deleted = example("installation.deleted")
    deleted["installation"]["id"] = 957387
    world.post("installation", deleted)
    world.drain()
    assert world.ctx.store.repos() == []


# ---- the web layer -----------------------------------------------------------------------------------------


def test_bad_or_missing_signature_is_401_and_records_nothing(world):
    event = label_event(world)
    assert world.post("pull_request", event, secret="not-the-secret-at-all").status_code == 401
    r = world.client.post("/webhook", json=event, headers={"X-GitHub-Event": "pull_request",
                                                            "X-GitHub-Delivery": "x"})
    assert r.status_code == 401
    world.drain()
    assert world.jobs() == [] and world.ctx.store.delivery_counts() == {}


def test_oversized_payload_is_refused_before_reading(world):
    from bot.web.server import MAX_WEBHOOK_BYTES

    r = world.client.post("/webhook", content=b"{}", headers={"Content-Length": str(MAX_WEBHOOK_BYTES + 1),
                                                                "X-GitHub-Event": "ping", "X-GitHub-Delivery": "x"})
    assert r.status_code == 413


def test_unhandled_events_are_acknowledged_not_stored(world):
    r = world.post("ping", example("ping.with-app_id"))
    assert r.status_code == 200 and r.json() == {"ignored": True}
    assert world.ctx.store.delivery_counts() == {}


def test_healthz_and_metrics(world):
    assert world.client.get("/healthz").json() == {"ok": True}
    world.post("pull_request", label_event(world))
    world.post("pull_request", label_event(world), delivery="dup")
    world.post("pull_request", label_event(world), delivery="dup")
    world.drain()
    text = world.client.get("/metrics").text
    assert 'fusebot_webhook_deliveries_total{event="pull_request",outcome="duplicate"} 1.0' in text
    assert 'fusebot_jobs{state="queued"} 2.0' in text
    assert 'fusebot_jobs_created_total{trigger="label"} 2.0' in text
    assert 'fusebot_deliveries{status="done"} 2.0' in text


# ---- the nightly run ---------------------------------------------------------------------------------------


def test_nightly_runs_all_targets_on_the_default_branch_and_takes_the_configs_schedule(world):
    from datetime import UTC, datetime

    from bot.features.nightly import tick

    config = "schedule:\n  cron: '15 1 * * *'\n  timezone: Asia/Tokyo\n"
    main = world.repo.commit({".github/fusebot.yml": config}, "config", branch="main")
    store = world.ctx.store
    store.set_schedule(REPO, enabled=True, cron="0 3 * * *", timezone="UTC",
                       next_run_at=datetime(2026, 1, 1, 3, tzinfo=UTC))
    assert len(tick(store, datetime(2026, 1, 1, 3, 5, tzinfo=UTC))) == 1
    world.drain()
    [job] = world.jobs()
    assert (job.trigger, job.sha, job.spec.ref, job.pr_number) == ("schedule", main, "main", None)
    assert [t.name for t in job.spec.targets] == ["models.attn.Attention", "models.mlp.MLP"]
    [repo] = store.repos()
    assert (repo.cron, repo.timezone) == ("15 1 * * *", "Asia/Tokyo")
    assert repo.next_run_at.hour == 16 and repo.next_run_at.minute == 15  # 01:15 in Tokyo is 16:15 UTC


def test_every_command_is_parsed_helped_dispatched_and_documented_from_one_registry():
    docs = (Path(__file__).resolve().parents[3] / "docs/bot.md").read_text()
    for name, spec in COMMANDS.items():
        typed = f"{PREFIX} {' '.join(spec.words)}"
        assert parse_command(typed.upper() if name == "run-all" else typed).name == name
        assert f"`{typed}`" in HELP and spec.summary in HELP
        assert f"`{typed}`" in docs, f"docs/bot.md does not name {typed}"
    assert set(HANDLERS) | set(BOT_PR_COMMANDS) == set(COMMANDS) and not set(HANDLERS) & set(BOT_PR_COMMANDS)
