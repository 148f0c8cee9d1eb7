"""`fusebot worker --bot URL`: lease units of work from a fusebot bot, run them on this GPU, report back.

The worker holds a runner token (never GitHub credentials). What it leases is a unit: one target of a job (the bot
splits a PR's or a nightly run's targets, so N workers on N GPUs work one job at once), handed over as a Job with that
one target. For each: lease (with a TTL) -> download the job's source -> `run_job(job, source_dir, progress)` while a
thread heartbeats (extending the lease, streaming progress, learning of cancellation) -> upload the JobResult. A lost
lease or a cancelled job stops the work. SIGTERM drains the worker (`serve`): it leases nothing more, and the running
unit finishes within `drain_seconds` or goes straight back to the queue, for another worker at once. Several workers on
one host each take one GPU (`--gpu N`).
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import httpx
import typer
from pydantic import ValidationError
from tenacity import retry, retry_if_exception, stop_after_delay, wait_exponential

from runner.cli.worker_log import HeldLease, quiet_polling, result_lines
from runner.cli.worker_settings import WorkerSettings, settings_problems
from runner.contract import ExitStatus, Job, JobResult, Progress
from runner.errors import UsageError
from runner.harness import bwrap
from runner.search.deadline import Cancelled

log = logging.getLogger(__name__)

RunJob = Callable[[Job, Path, Callable[[Progress], None]], JobResult]
LEASE_HEADER = "X-Fusebot-Lease"
class TokenRefused(Exception):
    """The bot does not know this runner's token: retrying cannot help."""


class JobStopped(Exception):
    """The job must stop: cancelled by the bot, or this worker's lease on it was lost."""


class WorkerStopping(BaseException):
    """SIGTERM: give the job back and exit (a BaseException so run_job's `except Exception` does not swallow it)."""


def _missing_run_job(job: Job, source_dir: Path, progress: Callable[[Progress], None]) -> JobResult:
    raise RuntimeError("runner.pipeline.run_job is not available in this installation: this worker cannot run searches")


def default_run_job() -> RunJob:
    """`runner.pipeline:run_job`, imported only when a job runs (it imports torch)."""
    try:
        module = importlib.import_module("runner.pipeline")
    except ImportError as e:
        if e.name not in ("runner.pipeline", "runner"):
            raise
        return _missing_run_job
    return module.run_job


def _transient(e: BaseException) -> bool:
    if isinstance(e, httpx.TransportError):
        return True
    return isinstance(e, httpx.HTTPStatusError) and e.response.status_code >= 500


class Heartbeat:
    """Posts the latest progress every `interval_seconds`; notes cancellation and lost leases."""

    def __init__(self, client: httpx.Client, job_id: str, lease: str, interval_seconds: float,
                 on_beat: Callable[[], None] = lambda: None) -> None:
        self.client, self.job_id, self.lease, self.interval = client, job_id, lease, interval_seconds
        self.on_beat = on_beat
        self.latest = Progress(message="started")
        self.cancelled = threading.Event()
        self.lost = threading.Event()
        self.stopping = threading.Event()  # either: every search of the job stops at once (runner/pipeline.py run_job)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id[:8]}", daemon=True)
        self.report = Report(self)

    def beat(self) -> None:
        try:
            r = self.client.post(f"/runner/v1/jobs/{self.job_id}/heartbeat", json=self.latest.model_dump(mode="json"),
                                 headers={LEASE_HEADER: self.lease})
        except httpx.TransportError as e:
            log.warning("heartbeat for job %s failed (%s); retrying", self.job_id, type(e).__name__)
            return
        if r.status_code == 409:
            log.warning("job %s: lease lost", self.job_id)
            self.lost.set()
            self.stopping.set()
        elif r.status_code == 200 and r.json().get("state") == "cancelled":
            log.info("job %s was cancelled: stopping every evaluation", self.job_id)
            self.cancelled.set()
            self.stopping.set()
        elif r.status_code != 200:
            log.warning("heartbeat for job %s: HTTP %d", self.job_id, r.status_code)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.on_beat()
            self.beat()
            if self.lost.is_set() or self.cancelled.is_set():
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(self.interval + 5)

    def note(self, progress: Progress) -> None:
        """Keep the latest progress for the next beat; raise JobStopped once the job must stop."""
        self.latest = progress
        if self.cancelled.is_set() or self.lost.is_set():
            raise JobStopped("cancelled" if self.cancelled.is_set() else "lease lost")


class Report:
    """The `progress` callback handed to run_job. It carries `cancel`, the event the heartbeat sets when the job is
    cancelled or its lease lost: run_job's searches watch it, so no proposer call or candidate process starts after
    it and the evaluations in flight are cut off (runner/search/cutoff.py)."""

    def __init__(self, heartbeat: Heartbeat) -> None:
        self.heartbeat, self.cancel = heartbeat, heartbeat.stopping

    def __call__(self, progress: Progress) -> None:
        self.heartbeat.note(progress)


def safe_extract(tarball: Path, dest: Path) -> None:
    with tarfile.open(tarball, "r:gz") as tar:
        tar.extractall(dest, filter="data")  # no absolute paths, no escaping links, no devices


class Worker:
    def __init__(self, settings: WorkerSettings, *, run_job: RunJob | None = None,
                 client: httpx.Client | None = None) -> None:
        self.settings = settings
        self.run_job = run_job
        self.client = client or httpx.Client(
            base_url=settings.bot_url,
            headers={"Authorization": f"Bearer {settings.token.get_secret_value()}"},
            timeout=httpx.Timeout(30.0, connect=5.0),
        )
        self.stop = threading.Event()
        self.current: tuple[str, str] | None = None  # (job id, lease token) while a job runs

    # ---- HTTP --------------------------------------------------------------------------------------------

    def lease(self) -> dict[str, Any] | None:
        r = self.client.post("/runner/v1/lease")
        self.set_ready(r.status_code in (200, 204))
        if r.status_code == 204:
            return None
        if r.status_code == 401:
            raise TokenRefused("the bot refused this runner's token (FUSEBOT_WORKER_TOKEN)")
        r.raise_for_status()
        return r.json()

    def _post_final(self, job_id: str, lease: str, path: str, body: dict[str, Any]) -> None:
        @retry(
            retry=retry_if_exception(_transient),
            stop=stop_after_delay(self.settings.upload_retry_seconds),
            wait=wait_exponential(multiplier=0.2, max=10),
            reraise=True,
        )
        def post() -> httpx.Response:
            r = self.client.post(f"/runner/v1/jobs/{job_id}/{path}", json=body, headers={LEASE_HEADER: lease})
            if r.status_code >= 500:
                r.raise_for_status()
            return r

        r = post()
        if r.status_code == 409:
            log.warning("job %s: %s not recorded: the lease was lost (another runner has the job)", job_id, path)
        elif r.status_code != 200:
            log.error("job %s: %s rejected: HTTP %d %s", job_id, path, r.status_code, r.text[:300])
        else:
            log.info("job %s: %s recorded=%s", job_id, path, r.json().get("recorded"))

    def download(self, job_id: str, lease: str, dest: Path) -> Path:
        tarball = dest / "source.tar.gz"
        with self.client.stream("GET", f"/runner/v1/jobs/{job_id}/source", headers={LEASE_HEADER: lease}) as r:
            if r.status_code in (403, 409):
                raise JobStopped("the lease is no longer valid (cancelled or expired)")
            r.raise_for_status()
            with tarball.open("wb") as f:
                for chunk in r.iter_bytes():
                    f.write(chunk)
        src = dest / "src"
        src.mkdir()
        safe_extract(tarball, src)
        tarball.unlink()
        return src

    # ---- one job -----------------------------------------------------------------------------------------

    def run_one(self) -> bool:
        """Lease and run one job. False when the queue was empty."""
        got = self.lease()
        if got is None:
            return False
        lease = got["lease_token"]
        try:
            job = Job.model_validate(got["job"])
        except ValidationError as e:  # a job from a newer bot (a kind or field this runner does not know)
            job_id = str((got.get("job") or {}).get("id", ""))
            log.error("job %s: this runner cannot read it (upgrade the runner): %s", job_id, e)
            self._post_final(job_id, lease, "fail", {"error": f"the runner could not read this job (upgrade the "
                                                              f"runner to the bot's version): {e}"[:10_000]})
            return True
        interval = min(self.settings.heartbeat_seconds, float(got["lease_ttl_seconds"]) / 3)
        unit = got.get("unit") or {}
        log.info("%s unit %s leased (job %s, target %s): %s@%s, %d kernel(s)%s", job.kind, job.id,
                 unit.get("job_id", job.id), unit.get("target") or "-", job.repo, job.sha[:12], len(job.kernels),
                 f"; {unit['retry_note']}" if unit.get("retry_note") else "")
        self.current = (job.id, lease)
        held = HeldLease(self.settings.lease_file)
        held.note(job.id, lease)
        try:
            self._execute(job, lease, interval)
        finally:
            self.current = None
            held.clear()
        return True

    def _execute(self, job: Job, lease: str, interval: float) -> None:
        base = self.settings.work_dir
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"fusebot-{job.id[:12]}-", dir=base) as tmp:
            try:
                with Heartbeat(self.client, job.id, lease, interval, self.touch_alive) as hb:
                    hb.beat()  # leased -> running at once
                    src = self.download(job.id, lease, Path(tmp))
                    run_job = self.run_job or default_run_job()
                    result = run_job(job, src, hb.report)
                    self.current = None  # done: a signal from here on lets the upload finish
                    if hb.lost.is_set():
                        raise JobStopped("lease lost")
                    if hb.cancelled.is_set():
                        raise JobStopped("cancelled")
            except (JobStopped, Cancelled) as e:
                log.info("job %s stopped: %s", job.id, e)
                return
            except WorkerStopping:
                log.info("job %s: worker stopping, giving it back", job.id)
                try:
                    self.client.post(f"/runner/v1/jobs/{job.id}/release", headers={LEASE_HEADER: lease})
                except httpx.TransportError:
                    log.warning("job %s: could not release; its lease will expire", job.id)
                raise
            except Exception as e:
                log.exception("job %s failed", job.id)
                error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)[-3000:]}"
                self._post_final(job.id, lease, "fail", {"error": error})
                return
        if result.job_id != job.id:
            result = result.model_copy(update={"job_id": job.id})
        for line in result_lines(job.id, result):
            log.info("%s", line)
        self._post_final(job.id, lease, "result", result.model_dump(mode="json"))

    # ---- the loop ----------------------------------------------------------------------------------------

    def touch_alive(self) -> None:
        """Liveness for a container health check: the file's age says when the loop or a heartbeat last ran."""
        path = self.settings.alive_file
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()

    def set_ready(self, ready: bool) -> None:
        """Readiness for an orchestrator: the file exists while the bot answers and the worker takes work."""
        path = self.settings.ready_file
        if path is None:
            return
        if ready and not self.stop.is_set():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
        else:
            path.unlink(missing_ok=True)

    def run(self, *, once: bool = False, max_jobs: int | None = None) -> int:
        """Lease and run units until stopped (or, with `once`, until the queue is empty). Returns units run."""
        HeldLease(self.settings.lease_file).give_back(self.client, LEASE_HEADER)  # a killed run's unit, at once
        done = 0
        while not self.stop.is_set() and (max_jobs is None or done < max_jobs):
            self.touch_alive()
            try:
                ran = self.run_one()
            except (httpx.TransportError, httpx.HTTPStatusError) as e:
                log.warning("bot unreachable or refusing (%s); retrying in %.1f s", e, self.settings.poll_seconds)
                self.set_ready(False)
                ran = False
                if once:
                    break
            if ran:
                done += 1
            elif once:
                break
            else:
                self.stop.wait(self.settings.poll_seconds)
        return done


def serve(w: Worker, *, once: bool = False) -> int | None:
    """`w.run()` with SIGTERM (and SIGINT) draining it: nothing more is leased; the running unit finishes within
    `drain_seconds`, or is released at once (0) or when that time is up. Returns the units run, None when one was
    given back. The main thread's handlers are restored afterwards."""

    def give_back(signum: int, _frame: FrameType | None) -> None:
        if w.current is not None:
            raise WorkerStopping()

    def drain(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: draining (%s)", signum, "nothing running" if w.current is None else
                 f"the running unit has {w.settings.drain_seconds:.0f} s to finish")
        w.stop.set()
        w.set_ready(False)
        if w.current is not None and w.settings.drain_seconds <= 0:
            raise WorkerStopping()
        if w.current is not None:
            signal.setitimer(signal.ITIMER_REAL, w.settings.drain_seconds)

    previous = {sig: signal.signal(sig, handler) for sig, handler in
                ((signal.SIGTERM, drain), (signal.SIGINT, drain), (signal.SIGALRM, give_back))}
    try:
        return w.run(once=once)
    except WorkerStopping:
        return None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        w.set_ready(False)


app = typer.Typer(add_completion=False, rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
                  help="Lease units of work from a fusebot bot and run them on this GPU.")


@app.command()
def worker(
    bot: Annotated[str | None, typer.Option("--bot", metavar="URL", help="The bot's base URL.")] = None,
    gpu: Annotated[int | None, typer.Option("--gpu", metavar="N", help="GPU index this worker uses (one worker per "
                                                                       "GPU).")] = None,
    once: Annotated[bool, typer.Option("--once", help="Exit when the queue is empty.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Also log every request to the bot.")] = False,
) -> None:
    """Lease units of work from a fusebot bot and run them on this GPU host.

    The runner token comes from FUSEBOT_WORKER_TOKEN, the bot's URL from --bot or FUSEBOT_WORKER_BOT_URL (every
    FUSEBOT_WORKER_* setting: docs/bot.md). The log has one line per unit leased and one per target with its
    verdict; polling is quiet unless -v.
    """
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_polling(verbose)
    overrides: dict[str, Any] = {}
    if bot is not None:
        overrides["bot_url"] = bot
    if gpu is not None:
        overrides["gpu_index"] = gpu
    try:
        settings = WorkerSettings(**overrides)
    except ValidationError as e:
        for line in settings_problems(e, set(overrides)):
            typer.echo(typer.style("error", fg="red", bold=True) + ": " + line, err=True)
        typer.echo("fusebot worker reads its settings from FUSEBOT_WORKER_* environment variables: docs/bot.md",
                   err=True)
        raise typer.Exit(ExitStatus.USAGE) from None
    try:  # the sandbox every job's untrusted code will run in, or the user's explicit opt-out
        bwrap.require()
    except (bwrap.SandboxUnavailable, UsageError) as e:
        log.error("%s", e)
        raise typer.Exit(ExitStatus.USAGE if isinstance(e, UsageError) else ExitStatus.MACHINE) from None
    if settings.gpu_index is not None:  # before anything imports torch
        os.environ["CUDA_VISIBLE_DEVICES"] = str(settings.gpu_index)
    w = Worker(settings)
    started = time.monotonic()
    try:
        n = serve(w, once=once)
    except TokenRefused as e:  # a configuration mistake: FUSEBOT_WORKER_TOKEN is not one the bot issued
        log.error("%s", e)
        raise typer.Exit(ExitStatus.USAGE) from None
    log.info("worker exiting after %.0f s (%s unit(s))", time.monotonic() - started, "one given back" if n is None else n)
