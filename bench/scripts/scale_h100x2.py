"""Two-GPU scaling figures (docs/scaling.md), measured on a host with two GPUs, offline.

    python3 bench/scripts/scale_h100x2.py [--parts app|search] [--targets N] [--out bench/results/h100x2-scale]

On two H200s, with a 15 s search budget per target, one worker finished 2 of the 4 targets in 240 s and two workers
one each in 160 s: the two parts together take over ten minutes. `--targets 2` halves the App part, and each part
can run alone (`--parts`).

1. The App: one job of N real-world targets (bench/suites/realworld/fp32, each marked `# fusebot: optimize` in a
   local repository's pull request), from the label webhook to the pull requests, with one `fusebot worker` (GPU 0)
   and then two (GPU 0 and GPU 1). The bot (`fusebot serve`'s app on loopback, a local SQLite store) and GitHub (the
   fake GitHub of tests/fakes/github_server.py, real HTTP) run in this process; the workers are `fusebot worker`
   processes. Figure: the two workers' wall time over the one worker's (target <= 0.55).
2. One search (llama_rmsnorm, the builtin catalog) with one GPU and with two (runner/harness/gpus.py: an evaluator
   process per GPU, the search's queue feeding both, every GPU's judge started before the search), on the same wall
   budget. Figure: verified candidates per hour with two GPUs over one (target >= 1.8).

Each configuration starts with an empty harness cache of its own (no build or torch.compile result carries over).
Writes OUT/results.json (every number, the GPU, driver, torch and commit) and OUT/README.md (the table).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout's bot/, runner/ and tests/ (the local GitHub and its helpers)

from bot.web.server import build_context, create_app  # noqa: E402
from runner.contract import SearchBudget  # noqa: E402
from runner.harness.evaluator import HarnessConfig  # noqa: E402
from runner.harness.gpus import device_evaluators  # noqa: E402
from runner.pipeline import make_proposers, problem_context, problem_from_file  # noqa: E402
from runner.search.loop import search  # noqa: E402
from tests.bot.conftest import make_settings  # noqa: E402
from tests.bot.helpers import (  # noqa: E402
    APP_ID,
    INSTALLATION,
    REPO,
    RUNNER_TOKENS,
    GitRepo,
    pr_payload,
    rsa_keys,
    signed_headers,
)
from tests.fakes.github_server import FakeGitHub, Pull  # noqa: E402
from tests.fakes.serve import serve_in_thread  # noqa: E402

log = logging.getLogger("scale")
SUITE = ROOT / "bench" / "suites" / "realworld" / "fp32"
TARGETS = ("llama_rmsnorm", "gemma_rmsnorm", "bert_residual_layernorm", "llama_causal_lm_loss")
SEARCH_PROBLEM = "llama_rmsnorm"
APP_TARGET_RATIO, SEARCH_TARGET_RATIO = 0.55, 1.8


def marked(text: str) -> str:
    """The suite's module with fusebot's marker above its class, as a maintainer marks one."""
    return text.replace("\nclass Model(", "\n# fusebot: optimize\nclass Model(", 1)


def app_run(workdir: Path, workers: int, budget_s: float, timeout_s: float, targets: tuple[str, ...] = TARGETS) -> dict:
    """One job of `targets` through the bot, with `workers` workers (GPU 0..workers-1): wall seconds from the
    workers' start to the job's gathered result and to its pull requests."""
    cache = workdir / "cache"
    fake = FakeGitHub(APP_ID, rsa_keys()[1], workdir / "git")
    with fake.running():
        repo = GitRepo.create(fake.git_root, REPO)
        config = f"budget: {{rounds: 2, wall_seconds: {budget_s}}}\n"
        main = repo.commit({".github/fusebot.yml": config, "README.md": "# scale\n"}, "initial")
        feature = repo.commit({f"models/{t}.py": marked((SUITE / f"{t}.py").read_text()) for t in targets},
                              "mark the modules", branch="feature")
        fake.add_repo(REPO, INSTALLATION, repo.bare)
        fake.add_pull(Pull(REPO, 2, feature, "feature", REPO, "main", main))
        fake.set_permission(REPO, "maintainer", "write")
        settings = make_settings(workdir, fake, lease_ttl_seconds=120, scheduler_interval_seconds=3600)
        ctx = build_context(settings)
        ctx.store.upsert_repo(REPO, INSTALLATION)
        with serve_in_thread(create_app(settings, ctx=ctx, background=True)) as url:
            body = json.dumps(pr_payload("labeled", number=2, head_sha=feature, base_sha=main,
                                         label="optimize-kernels")).encode()
            httpx.post(f"{url}/webhook", content=body, headers=signed_headers("pull_request", body)).raise_for_status()
            deadline = time.monotonic() + 60
            while not ctx.store.list_jobs() and time.monotonic() < deadline:
                time.sleep(0.2)
            [job] = ctx.store.list_jobs()
            assert len(job.spec.targets) == len(targets), job.spec.targets
            names = list(RUNNER_TOKENS)
            procs = []
            t0 = time.monotonic()
            for gpu in range(workers):
                env = {**os.environ, "FUSEBOT_WORKER_TOKEN": RUNNER_TOKENS[names[gpu]], "FUSEBOT_CACHE_DIR": str(cache),
                       "FUSEBOT_WORKER_POLL_SECONDS": "0.5", "FUSEBOT_WORKER_HEARTBEAT_SECONDS": "5",
                       "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
                procs.append(subprocess.Popen([sys.executable, "-m", "bot.cli", "worker", "--bot", url, "--gpu",
                                               str(gpu)], env=env, cwd=workdir, stdout=(workdir / f"worker{gpu}.log")
                                              .open("w"), stderr=subprocess.STDOUT))
            finished_s = delivered_s = None
            while time.monotonic() - t0 < timeout_s:
                info = ctx.store.get(job.id)
                if finished_s is None and info.state in ("succeeded", "failed", "cancelled"):
                    finished_s = time.monotonic() - t0
                if finished_s is not None and info.notified_state == info.state:
                    delivered_s = time.monotonic() - t0
                    break
                time.sleep(0.2)
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
            info = ctx.store.get(job.id)
            units = [{"target": u.target, "state": u.state, "worker": u.leased_by, "attempts": u.attempts}
                     for u in ctx.store.units(job.id)]
            pulls = [pr.head_ref for pr in fake.pulls.values() if pr.user == "fusebot[bot]"]
    targets = [{"target": t.target, "improved": t.improved, "verified": bool(t.verdict and t.verdict.accepted),
                "message": t.message[:200]} for t in (info.result.targets if info.result else [])]
    return {"workers": workers, "job_state": info.state, "finished_s": finished_s, "delivered_s": delivered_s,
            "timed_out": delivered_s is None, "units": units, "targets": targets, "pull_requests": pulls,
            "budget_wall_seconds_per_target": budget_s, "searched": list(targets), "allowed_s": timeout_s}


def search_run(workdir: Path, devices: list[int], wall_s: float) -> dict:
    """One search of SEARCH_PROBLEM on `devices` for `wall_s` seconds: verified candidates per hour."""
    spec = problem_from_file(SUITE / f"{SEARCH_PROBLEM}.py")
    budget = SearchBudget(rounds=100, ideas_per_round=8, implementations_per_idea=4, wall_seconds=wall_s)
    config = HarnessConfig(cache_dir=workdir / "cache")
    with device_evaluators(spec, "cuda", devices, config, visible=torch.cuda.device_count()) as ev:
        ctx = problem_context(spec, ev, "cuda")
        for device in getattr(ev, "evaluators", {}).values():  # every GPU's judge started and its baselines measured
            device.baselines()
        result = search(ctx, ev, make_proposers([]), budget, workdir / "trace.jsonl", min_gain=-1.0)
        per_device = {}
        for a in result.history.attempts:
            if a.verdict is not None and a.verdict.environment is not None:
                per_device[a.verdict.environment.device] = per_device.get(a.verdict.environment.device, 0) + 1
    verified = result.progress.verified
    return {"devices": devices, "wall_seconds": result.wall_seconds, "candidates": result.candidates,
            "verified": verified, "verified_per_hour": 3600.0 * verified / result.wall_seconds if result.wall_seconds
            else None, "stop_reason": result.stop_reason, "evaluated_per_device": per_device}


def machine() -> dict:
    def run(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {"gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
            "driver": run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()[0:1],
            "torch": torch.__version__, "cuda": torch.version.cuda, "commit": run(["git", "rev-parse", "HEAD"]),
            "dirty": bool(run(["git", "status", "--porcelain", "--untracked-files=no"])),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")}


def readme(r: dict) -> str:
    m, a1, a2, s1, s2 = r["machine"], r["app"]["one"], r["app"]["two"], r["search"]["one"], r["search"]["two"]

    def ok(x: float | None, target: float, below: bool) -> str:
        return "n/a" if x is None else f"{x:.2f} ({'meets' if (x <= target if below else x >= target) else 'misses'} " \
                                      f"the target {'<=' if below else '>='} {target})"

    driver = m["driver"][0] if m["driver"] else "n/a"
    return f"""# Two GPUs: the App's fan-out and one search over both

{m['gpus']}x {m['gpu']}; driver {driver}; torch {m['torch']}, CUDA {m['cuda']}; fusebot commit {m['commit'][:12]}\
{' (with uncommitted edits)' if m['dirty'] else ''}; {m['date']}. Measured by `bench/scripts/scale_h100x2.py`.

## One job of {len(a1['searched'])} real-world targets: one worker against two

{', '.join(a1['searched'])} (bench/suites/realworld/fp32), marked in a pull request of a local repository; the label webhook
to the bot (local SQLite store, the fake GitHub on loopback); `fusebot worker --gpu N` processes; a search budget of
{a1['budget_wall_seconds_per_target']} s per target. Wall time from the workers' start.

| workers | job finished s | pull requests delivered s | units (target: worker) |
| ---: | ---: | ---: | --- |
| 1 | {a1['finished_s']} | {a1['delivered_s']} | {'; '.join(f"{u['target']}: {u['worker']}" for u in a1['units'])} |
| 2 | {a2['finished_s']} | {a2['delivered_s']} | {'; '.join(f"{u['target']}: {u['worker']}" for u in a2['units'])} |

Two workers over one (delivered): {ok(r['app']['ratio'], APP_TARGET_RATIO, True)}.

## One search: one GPU against two

{SEARCH_PROBLEM}, the builtin catalog, {s1['wall_seconds']:.0f} s and {s2['wall_seconds']:.0f} s of search; an
evaluator process per GPU, the search's queue feeding them.

| GPUs | candidates | verified | verified per hour | evaluated per device | stop |
| ---: | ---: | ---: | ---: | --- | --- |
| 1 | {s1['candidates']} | {s1['verified']} | {s1['verified_per_hour']} | {s1['evaluated_per_device']} | {s1['stop_reason']} |
| 2 | {s2['candidates']} | {s2['verified']} | {s2['verified_per_hour']} | {s2['evaluated_per_device']} | {s2['stop_reason']} |

Two GPUs over one (verified per hour): {ok(r['search']['ratio'], SEARCH_TARGET_RATIO, False)}.

Every number is in results.json.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "h100x2-scale")
    parser.add_argument("--budget-seconds", type=float, default=15.0, help="search budget per target (App)")
    parser.add_argument("--search-seconds", type=float, default=35.0, help="wall budget of each search (part 2)")
    parser.add_argument("--parts", default="app,search", help="which parts to run: app, search or both")
    parser.add_argument("--targets", type=int, default=len(TARGETS), choices=range(2, len(TARGETS) + 1),
                        help="how many of the App's targets (the first N)")
    parser.add_argument("--target-seconds", type=float, default=150.0,
                        help="the App part's time allowed per target on one worker (two workers: half, plus 60 s)")
    args = parser.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if torch.cuda.device_count() < 2:
        sys.exit(f"this needs two GPUs; torch sees {torch.cuda.device_count()}")
    started = time.monotonic()
    results: dict = {"machine": machine(), "app": {}, "search": {}}
    with tempfile.TemporaryDirectory(prefix="fusebot-scale-") as tmp:
        for key, n in (("one", 1), ("two", 2)) if "app" in args.parts else ():
            (Path(tmp) / f"app{n}").mkdir()
            chosen = TARGETS[:args.targets]
            allowed = args.target_seconds * len(chosen) / n + (60 if n > 1 else 0)
            results["app"][key] = app_run(Path(tmp) / f"app{n}", n, args.budget_seconds, allowed, chosen)
            log.info("app, %d worker(s): %s", n, results["app"][key])
        for key, devices in (("one", [0]), ("two", [0, 1])) if "search" in args.parts else ():
            (Path(tmp) / f"search{len(devices)}").mkdir()
            results["search"][key] = search_run(Path(tmp) / f"search{len(devices)}", devices, args.search_seconds)
            log.info("search, %d GPU(s): %s", len(devices), results["search"][key])
    if results["app"]:
        a1, a2 = results["app"]["one"]["delivered_s"], results["app"]["two"]["delivered_s"]
        results["app"]["ratio"] = a2 / a1 if a1 and a2 else None
    if results["search"]:
        r1, r2 = results["search"]["one"]["verified_per_hour"], results["search"]["two"]["verified_per_hour"]
        results["search"]["ratio"] = r2 / r1 if r1 and r2 else None
    results["total_seconds"] = time.monotonic() - started
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    if results["app"] and results["search"]:
        (args.out / "README.md").write_text(readme(results))
    log.info("wrote %s in %.0f s: app %s, search %s", args.out, results["total_seconds"],
             results["app"].get("ratio"), results["search"].get("ratio"))


if __name__ == "__main__":
    main()
