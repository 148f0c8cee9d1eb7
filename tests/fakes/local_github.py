"""A GitHub on this machine for trying the App end to end: the fake GitHub of tests/fakes/github_server.py (real HTTP,
every request checked against GitHub's OpenAPI description) serving one repository with a pull request that adds a
module marked `# fusebot: optimize`, and the App's key, webhook secret and runner token to go with it.

\b
    python -m tests.fakes.local_github setup --workdir DIR     # the repository, its PR, keys; DIR/env.sh for the bot
    python -m tests.fakes.local_github serve --workdir DIR &   # GitHub, until stopped
    source DIR/env.sh && fusebot serve &                       # the bot, pointed at it
    fusebot worker --bot http://127.0.0.1:8000 &               # a runner
    python -m tests.fakes.local_github label --workdir DIR     # a maintainer labels the PR: the signed webhook
    python -m tests.fakes.local_github comment --workdir DIR "/fusebot status"   # a maintainer comments on the PR
    python -m tests.fakes.local_github show --workdir DIR      # the PR's comments, check runs and annotations

`serve` logs each request the bot makes to GitHub, each comment and check run fusebot writes or changes, and, when
fusebot opens or updates a pull request, its title and files, writing its body to DIR/pulls/<number>.md. `comment`
posts the comment to this GitHub as the maintainer (so fusebot can react to it) and sends the bot the signed
`issue_comment` webhook GitHub would; `show` reads back, through GitHub's own API, what a maintainer would see on
the PR's page, with GitHub's times (UTC). Everything lives under DIR; nothing leaves this machine. What the bot and
the maintainer write (comments, reactions, pull requests, check runs) is kept in DIR/github-state.json, so a
restarted `serve` shows the PR as it was left.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from bot.github.webhooks import sign
from tests.fakes.github_server import FakeGitHub, Pull, github_time
from tests.fakes.serve import free_port

log = logging.getLogger("local-github")

ROOT = Path(__file__).resolve().parents[2]
LABEL = "optimize-kernels"
MAINTAINER = "maintainer"  # who labels the PR: write access
PR_NUMBER = 1
STATE = "local-github.json"
GITHUB_STATE = "github-state.json"  # what requests wrote: comments, reactions, pull requests, check runs, tokens
CONFIG = "budget: {rounds: 1, ideas_per_round: 2, implementations_per_idea: 1, wall_seconds: 1800}\n"

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False, help=__doc__,
                  context_settings={"help_option_names": ["-h", "--help"]})
UNREACHABLE = 3  # runner.contract.ExitStatus.MACHINE: the bot or this GitHub is not there


def _state(workdir: Path) -> dict[str, Any]:
    if not (workdir / STATE).exists():
        raise typer.BadParameter(f"{workdir}: run `setup --workdir {workdir}` first", param_hint="--workdir")
    return json.loads((workdir / STATE).read_text())


def make_world(fake: FakeGitHub, state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The repository (main: a config; the PR's branch adds examples/row_gain.py), its pull request, and who may
    label it; made anew, or registered again from `state` (the bare repository stays on disk; the pull request as
    `fake` kept it, when it did)."""
    from tests.bot.helpers import INSTALLATION, REPO, GitRepo

    if state is None:
        repo = GitRepo.create(fake.git_root, REPO)
        main = repo.commit({"README.md": "# a repository with modules for fusebot\n", ".github/fusebot.yml": CONFIG},
                           "initial")
        feature = repo.commit({"models/row_gain.py": (ROOT / "examples" / "row_gain.py").read_text()},
                              "models: per-row gains", branch="feature")
        state = {"repo": REPO, "installation": INSTALLATION, "main": main, "feature": feature,
                 "opened_at": github_time()}
    fake.add_repo(state["repo"], state["installation"], fake.git_root / f"{state['repo']}.git")
    if (state["repo"], PR_NUMBER) not in fake.pulls:
        opened = state.get("opened_at", github_time())
        fake.add_pull(Pull(state["repo"], PR_NUMBER, state["feature"], "feature", state["repo"], "main", state["main"],
                           labels=[LABEL], title="models: per-row gains", created_at=opened, updated_at=opened))
    fake.set_permission(state["repo"], MAINTAINER, "write")
    if state.get("maintainer_token"):
        fake.user_tokens[state["maintainer_token"]] = MAINTAINER
    return state


def write_env(workdir: Path, api_url: str, git_template: str, app_id: int, key: Path, secret: str, token: str) -> Path:
    values = {
        "FUSEBOT_APP_ID": str(app_id), "FUSEBOT_PRIVATE_KEY_PATH": str(key), "FUSEBOT_WEBHOOK_SECRET": secret,
        "FUSEBOT_RUNNER_TOKENS": json.dumps({"local": token}), "FUSEBOT_WORKER_TOKEN": token,
        "FUSEBOT_GITHUB_API_URL": api_url, "FUSEBOT_GIT_URL_TEMPLATE": git_template,
        "DATABASE_URL": f"sqlite:///{workdir / 'bot.db'}", "FUSEBOT_DATA_DIR": str(workdir / "bot-data"),
        "FUSEBOT_GITHUB_REQUEST_INTERVAL_SECONDS": "0", "FUSEBOT_GITHUB_WRITE_INTERVAL_SECONDS": "0",
    }
    path = workdir / "env.sh"
    path.write_text("".join(f"export {k}='{v}'\n" for k, v in values.items()))
    path.chmod(0o600)
    return path


class Reporter:
    """Logs the bot's requests as they arrive, and each fusebot pull request once per change."""

    def __init__(self, fake: FakeGitHub, workdir: Path) -> None:
        self.fake, self.workdir = fake, workdir
        self.seen_calls, self.seen_errors = 0, 0
        self.seen_pulls: dict[int, tuple] = {}
        self.seen: dict[str, Any] = {}  # comment and check-run keys -> what was last logged

    def poll(self) -> None:
        with self.fake._lock:
            calls, errors = self.fake.calls[self.seen_calls:], self.fake.errors[self.seen_errors:]
            self.seen_calls, self.seen_errors = self.seen_calls + len(calls), self.seen_errors + len(errors)
            pulls = [p for p in self.fake.pulls.values() if p.user == "fusebot[bot]"]
            comments = {f"comment {i}": (c["issue"], c["user"], c["body"]) for i, c in self.fake.comments.items()}
            runs = {f"check run {i}": (r["name"], r["status"], r.get("conclusion"), r["output"].get("title"),
                                       len(r["output"].get("annotations", [])))
                    for i, r in self.fake.check_runs.items()}
            reactions = {f"reaction {r['id']}": (r["comment_id"], r["content"]) for r in self.fake.reactions}
        for c in calls:
            log.info("%s %s -> %d", c.method, c.path, c.status)
        for e in errors:
            log.warning("outside GitHub's OpenAPI description: %s", e)
        for key, now in {**comments, **runs, **reactions}.items():
            if self.seen.get(key) != now:
                self.seen[key] = now
                log.info("%s: %s", key, _one_line(now))
        for p in pulls:
            state = (p.head_sha, p.title, p.body)
            if self.seen_pulls.get(p.number) == state:
                continue
            self.seen_pulls[p.number] = state
            (self.workdir / "pulls").mkdir(exist_ok=True)
            body = self.workdir / "pulls" / f"{p.number}.md"
            body.write_text(f"# {p.title}\n\n{p.body or ''}\n")
            files = self.fake._git(self.fake.repos[p.repo], "diff", "--name-only", f"{p.base_sha}..{p.head_sha}")
            log.info("fusebot pull request #%d %r: %s <- %s\n  files: %s\n  body: %s", p.number, p.title,
                     p.base_ref, p.head_ref, ", ".join(files.split()), body)


def _one_line(value: Any) -> str:
    text = " | ".join(str(v) for v in value)
    return " ".join(text.split())[:300]


@app.command()
def setup(
    workdir: Annotated[Path, typer.Option(help="Where the repository, keys, env.sh and the bot's files go.")],
    port: Annotated[int, typer.Option(help="The port `serve` will listen on (0: a free one now).")] = 0,
) -> None:
    """Make the repository with its labelled pull request, the App's key and secrets; write DIR/env.sh."""
    from tests.bot.helpers import APP_ID, rsa_keys

    workdir = workdir.resolve()
    if (workdir / STATE).exists():
        raise typer.BadParameter(f"{workdir} was set up before: choose a new --workdir", param_hint="--workdir")
    workdir.mkdir(parents=True, exist_ok=True)
    private, public = rsa_keys()
    key = workdir / "app.pem"
    key.write_text(private)
    key.chmod(0o600)
    secret, token, maintainer_token = secrets.token_hex(32), secrets.token_hex(20), secrets.token_hex(20)
    fake = FakeGitHub(APP_ID, public, workdir / "git")
    world = make_world(fake)
    api_url = f"http://127.0.0.1:{port or free_port()}"
    env = write_env(workdir, api_url, fake.clone_url_template(), APP_ID, key, secret, token)
    state = workdir / STATE
    state.write_text(json.dumps({**world, "app_id": APP_ID, "public_key": public, "api_url": api_url,
                                 "secret": secret, "maintainer_token": maintainer_token}))
    state.chmod(0o600)
    typer.echo(f"{world['repo']}: pull request #{PR_NUMBER} (main <- feature) adds models/row_gain.py; "
               f"GitHub will be {api_url}; the bot's settings: {env}")


@app.command()
def serve(
    workdir: Annotated[Path, typer.Option(help="The --workdir given to `setup`.")],
) -> None:
    """Serve the repository set up in DIR as GitHub would, logging the bot's requests and fusebot's pull requests."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    workdir = workdir.resolve()
    state = _state(workdir)
    fake = FakeGitHub(state["app_id"], state["public_key"], workdir / "git", state_file=workdir / GITHUB_STATE)
    fake.base_url = state["api_url"]
    make_world(fake, state)
    port = int(state["api_url"].rsplit(":", 1)[1])
    server = uvicorn.Server(uvicorn.Config(fake.asgi(), host="127.0.0.1", port=port, log_config=None,
                                           access_log=False))
    reporter = Reporter(fake, workdir)
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(0.5):
            reporter.poll()

    thread = threading.Thread(target=report, daemon=True)
    thread.start()
    log.info("GitHub for %s on %s (%d comment(s), %d check run(s) kept from before)", state["repo"], fake.base_url,
             len(fake.comments), len(fake.check_runs))
    try:
        server.run()  # until SIGINT or SIGTERM
    finally:
        stop.set()
        thread.join(2)
        reporter.poll()


def labeled_payload(world: dict[str, Any]) -> dict[str, Any]:
    """GitHub's own `pull_request` `labeled` example, pointed at the local repository's pull request."""
    from tests.bot.helpers import pr_payload

    return pr_payload("labeled", number=PR_NUMBER, head_sha=world["feature"], base_sha=world["main"], label=LABEL,
                      sender=MAINTAINER)


@app.command()
def label(
    workdir: Annotated[Path, typer.Option(help="The --workdir given to `serve`.")],
    bot: Annotated[str, typer.Option(help="The bot's base URL.")] = "http://127.0.0.1:8000",
) -> None:
    """Send the bot the webhook GitHub sends when a maintainer labels the pull request, signed with the secret."""
    world = _state(workdir.resolve())
    _send(bot, world, "pull_request", labeled_payload(world))


def _send(bot: str, world: dict[str, Any], event: str, payload: dict[str, Any]) -> None:
    """POST a webhook as GitHub does: signed with the secret, a fresh delivery id."""
    body = json.dumps(payload).encode()
    headers = {"X-GitHub-Event": event, "X-GitHub-Delivery": f"local-{time.time_ns()}",
               "X-Hub-Signature-256": sign(body, world["secret"].encode()), "Content-Type": "application/json"}
    try:
        r = httpx.post(f"{bot.rstrip('/')}/webhook", content=body, headers=headers, timeout=30)
    except httpx.TransportError as e:
        typer.echo(f"error: no bot at {bot}: start `fusebot serve` or pass --bot URL ({type(e).__name__})", err=True)
        raise typer.Exit(UNREACHABLE) from None
    typer.echo(f"{r.status_code} {r.text}")
    raise typer.Exit(0 if r.status_code < 300 else 1)


def _as_maintainer(world: dict[str, Any]) -> httpx.Client:
    """A client on this GitHub's API with the maintainer's own token (set up by `setup`)."""
    if not world.get("maintainer_token"):
        raise typer.BadParameter("this workdir predates `comment` and `show`: run `setup` in a new one")
    return httpx.Client(base_url=world["api_url"], timeout=30,
                        headers={"Authorization": f"token {world['maintainer_token']}"})


@contextmanager
def _github_there(world: dict[str, Any]) -> Iterator[None]:
    """This GitHub not serving is said in one line, with the command that starts it."""
    try:
        yield
    except httpx.TransportError as e:
        typer.echo(f"error: no GitHub at {world['api_url']}: start `python -m tests.fakes.local_github serve --workdir "
                   f"DIR` ({type(e).__name__})", err=True)
        raise typer.Exit(UNREACHABLE) from None


@app.command()
def comment(
    text: Annotated[str, typer.Argument(help="The comment, e.g. \"/fusebot status\".")],
    workdir: Annotated[Path, typer.Option(help="The --workdir given to `serve`.")],
    bot: Annotated[str, typer.Option(help="The bot's base URL.")] = "http://127.0.0.1:8000",
) -> None:
    """Comment on the pull request as the maintainer: the comment on GitHub, then the signed webhook to the bot."""
    from tests.bot.helpers import comment_payload

    world = _state(workdir.resolve())
    with _as_maintainer(world) as gh, _github_there(world):
        r = gh.post(f"/repos/{world['repo']}/issues/{PR_NUMBER}/comments", json={"body": text})
    r.raise_for_status()
    posted = r.json()
    payload = comment_payload(text, number=PR_NUMBER, comment_id=posted["id"], sender=MAINTAINER)
    payload["comment"]["created_at"] = posted["created_at"]
    payload["repository"]["full_name"] = world["repo"]
    payload["installation"]["id"] = world["installation"]
    _send(bot, world, "issue_comment", payload)


@app.command()
def show(
    workdir: Annotated[Path, typer.Option(help="The --workdir given to `serve`.")],
) -> None:
    """What a maintainer sees on the pull request: its comments, and the check runs on its head with annotations."""
    world = _state(workdir.resolve())
    repo = world["repo"]
    with _as_maintainer(world) as gh, _github_there(world):
        comments = gh.get(f"/repos/{repo}/issues/{PR_NUMBER}/comments").json()
        runs = gh.get(f"/repos/{repo}/commits/{world['feature']}/check-runs").json()["check_runs"]
        notes = {r["id"]: gh.get(f"/repos/{repo}/check-runs/{r['id']}/annotations").json() for r in runs}
    typer.echo(f"# pull request #{PR_NUMBER} of {repo}: {len(comments)} comment(s)")
    for c in comments:
        typer.echo(f"\n## {c['user']['login']} at {c['created_at']}\n{c['body']}")
    typer.echo(f"\n# check runs on {world['feature'][:12]}")
    for r in runs:
        state = r["conclusion"] or r["status"]
        when = f"started {r['started_at']}" + (f", completed {r['completed_at']}" if r["completed_at"] else "")
        typer.echo(f"\n## {r['name']}: {state}: {r['output']['title']} ({when})\n{r['output']['summary'] or ''}")
        for a in notes[r["id"]]:
            typer.echo(f"- {a['path']}:{a['start_line']}: {a['annotation_level']}: {a['message']}")


if __name__ == "__main__":
    app()
