"""The web service: `create_app(settings)` and the `fusebot serve` command.

POST /webhook verifies, records the delivery and answers at once (202 new, 200 repeat); the background loop does
everything that talks to GitHub: a thread for tests and embedding, a child process under `fusebot serve`, so its
work never holds the web process's GIL while a burst of webhooks waits for an answer (tests/bot/test_load.py, 2
shared cores, p99 at 16 / 64 concurrent deliveries: thread ~75 / ~200 ms, process ~37 / ~150 ms).
GET /healthz, GET /metrics (Prometheus), and the runner API under /runner/v1.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from multiprocessing.connection import Connection
from typing import Any, Literal

import typer
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from starlette.concurrency import run_in_threadpool

from bot.context import Context
from bot.features import router as default_router
from bot.github import webhooks
from bot.github.client import GitHubApp
from bot.github.routing import Router
from bot.logs import install_redaction, setup_logging
from bot.store.db import init_db
from bot.store.store import Store
from bot.web.metrics import Metrics
from bot.web.runner_api import make_router
from bot.web.settings import Settings, SettingsError, load_settings
from bot.web.tasks import Background, PipeWake
from runner.contract import ExitStatus

log = logging.getLogger(__name__)
MAX_WEBHOOK_BYTES = 25 * 1024 * 1024  # GitHub caps payloads at 25 MB


def build_context(settings: Settings, github_app: GitHubApp | None = None) -> Context:
    sessions = init_db(settings.database_url)
    store = Store(sessions, max_attempts=settings.max_attempts, claim_seconds=settings.delivery_claim_seconds)
    assert settings.private_key is not None  # the validator guarantees it
    gh = github_app or GitHubApp(
        settings.app_id,
        settings.private_key.get_secret_value(),
        settings.github_api_url,
        git_url_template=settings.git_url_template,
        seconds_between_requests=settings.github_request_interval_seconds,
        seconds_between_writes=settings.github_write_interval_seconds,
    )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    return Context(settings=settings, store=store, github=gh, metrics=Metrics())


def _background_process(settings: Settings, wake_reader: Connection, parent_pid: int) -> None:
    """The background loop as a child process of `fusebot serve` (spawned: a fresh interpreter). SIGTERM stops it
    after the delivery in hand; it also stops by itself when the web process is gone."""
    setup_logging(settings.log_level, settings.secrets())
    ctx = build_context(settings)
    ctx.wake = PipeWake(reader=wake_reader)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
    Background(ctx, default_router, stop=stop, parent_pid=parent_pid).run()


def create_app(
    settings: Settings,
    *,
    ctx: Context | None = None,
    router: Router | None = None,
    background: bool | Literal["process"] = True,
) -> FastAPI:
    """`background`: True runs the worker as a thread, "process" as a child process, False not at all (tests then
    call `app.state.background.drain()`)."""
    install_redaction(settings.secrets())
    ctx = ctx or build_context(settings)
    router = router or default_router
    worker = Background(ctx, router)
    secret = settings.webhook_secret.get_secret_value().encode()
    mp = multiprocessing.get_context("spawn")
    child: list[Any] = []

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if background == "process":
            reader, writer = mp.Pipe(duplex=False)
            proc = mp.Process(target=_background_process, args=(settings, reader, os.getpid()),
                              name="fusebot-background", daemon=True)
            proc.start()
            reader.close()
            ctx.wake = PipeWake(writer=writer)
            child[:] = [proc]
        elif background:
            worker.start()
        yield
        if child:
            [proc] = child
            proc.terminate()  # SIGTERM: finish the delivery in hand, then exit
            await run_in_threadpool(proc.join, 15)
            if proc.is_alive():
                proc.kill()
        elif background:
            await run_in_threadpool(worker.stop)

    app = FastAPI(title="fusebot", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    app.state.background = worker

    @app.post("/webhook")
    async def webhook(request: Request) -> JSONResponse:
        t0 = time.perf_counter()
        declared = request.headers.get("content-length", "0")
        if not declared.isdigit() or int(declared) > MAX_WEBHOOK_BYTES:
            return JSONResponse({"error": "payload too large"}, status_code=413)
        body = await request.body()
        if len(body) > MAX_WEBHOOK_BYTES:
            return JSONResponse({"error": "payload too large"}, status_code=413)
        try:
            ev = webhooks.parse(request.headers, body, secret)
        except webhooks.InvalidSignature as e:
            ctx.metrics.webhooks.labels("-", "bad_signature").inc()
            log.warning("webhook rejected: %s (delivery %s)", e, request.headers.get("x-github-delivery"))
            return JSONResponse({"error": "bad signature"}, status_code=401)
        except webhooks.BadRequest as e:
            ctx.metrics.webhooks.labels("-", "bad_request").inc()
            return JSONResponse({"error": str(e)}, status_code=400)
        if not router.handlers_for(ev):
            ctx.metrics.webhooks.labels(ev.name, "ignored").inc()
            return JSONResponse({"ignored": True}, status_code=200)
        new = await run_in_threadpool(ctx.store.record_delivery, ev, body)
        if new:
            ctx.wake.set()
        ctx.metrics.webhooks.labels(ev.name, "queued" if new else "duplicate").inc()
        ctx.metrics.webhook_seconds.observe(time.perf_counter() - t0)
        return JSONResponse({"queued": new, "duplicate": not new}, status_code=202 if new else 200)

    @app.get("/healthz")
    def healthz() -> JSONResponse:
        """200 when the database answers and the background loop is alive; 503 otherwise."""
        with ctx.store.sessions() as s:
            s.execute(text("SELECT 1"))
        if (child and not child[0].is_alive()) or (background is True and not worker.alive()):
            return JSONResponse({"ok": False, "error": "background loop is not running"}, status_code=503)
        return JSONResponse({"ok": True})

    @app.get("/metrics")
    def metrics() -> PlainTextResponse:
        counts = ctx.store.counts_by_state()
        for state in ("queued", "leased", "running", "succeeded", "failed", "cancelled"):
            ctx.metrics.jobs.labels(state).set(counts.get(state, 0))
        inbox = ctx.store.delivery_counts()
        for status in ("pending", "processing", "done", "failed"):
            ctx.metrics.deliveries.labels(status).set(inbox.get(status, 0))
        return PlainTextResponse(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(make_router(ctx))
    return app


app = typer.Typer(add_completion=False, rich_markup_mode=None, help="Run fusebot's GitHub App web service.",
                  context_settings={"help_option_names": ["-h", "--help"]})


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", metavar="HOST", help="Address to listen on."),
    port: int = typer.Option(8000, metavar="PORT", help="Port to listen on."),
) -> None:
    """Serve webhooks, the runner API, /healthz and /metrics. Settings come from FUSEBOT_* variables."""
    import uvicorn  # the server, only when serving

    try:
        settings = load_settings()
    except SettingsError as e:
        logging.basicConfig(level="ERROR", format="%(levelname)s %(name)s: %(message)s")
        log.error("%s", e)
        raise typer.Exit(ExitStatus.USAGE) from None
    setup_logging(settings.log_level, settings.secrets())
    log.info("fusebot serve on %s:%d, database %s", host, port, settings.database_url.split("@")[-1])
    uvicorn.run(create_app(settings, background="process"), host=host, port=port, log_config=None, access_log=False)
