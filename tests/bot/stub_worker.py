"""A worker process for the durability tests: runner/cli/worker.py's Worker with a stub run_job.

    python -m tests.bot.stub_worker URL MODE      (token from FUSEBOT_WORKER_TOKEN)

MODE `block`: the job never finishes (the test kills or stops the process); `quick`: succeed at once.
SIGTERM behaves as in `fusebot worker`: the running job is released.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path

from runner.cli.worker import Worker, WorkerSettings, WorkerStopping
from runner.contract import Job, JobResult, Progress


def main() -> None:
    logging.basicConfig(level="INFO", format="worker %(levelname)s %(name)s: %(message)s")
    url, mode = sys.argv[1], sys.argv[2]

    def run_job(job: Job, source_dir: Path, progress) -> JobResult:
        progress(Progress(round=1, message="started"))
        print(f"RUNNING {job.id}", flush=True)
        while mode == "block":
            time.sleep(0.05)
            progress(Progress(round=1, message="working"))
        return JobResult(job_id=job.id, ok=True)

    w = Worker(WorkerSettings(bot_url=url, poll_seconds=0.1, heartbeat_seconds=0.3), run_job=run_job)

    def on_term(signum, frame) -> None:
        w.stop.set()
        if w.current is not None:
            raise WorkerStopping()

    signal.signal(signal.SIGTERM, on_term)
    try:
        w.run()
    except WorkerStopping:
        print("RELEASED", flush=True)


if __name__ == "__main__":
    main()
