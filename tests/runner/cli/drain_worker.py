"""A worker process for the drain tests: runner/cli/worker.py's `serve` (what `fusebot worker` runs) with a stub
run_job.

    python -m tests.runner.cli.drain_worker URL MODE DRAIN_SECONDS READY_FILE   (token from FUSEBOT_WORKER_TOKEN)

MODE `block`: the unit never finishes; `slow`: it finishes 1.5 s after it started. Prints RUNNING <unit id> when a
unit starts, then GAVE BACK (serve returned None: the unit was released) or DONE <n>.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from runner.cli.worker import Worker, WorkerSettings, serve
from runner.contract import Job, JobResult, Progress, TargetResult


def main() -> None:
    logging.basicConfig(level="INFO", format="worker %(levelname)s %(name)s: %(message)s")
    url, mode, drain_s, ready = sys.argv[1], sys.argv[2], float(sys.argv[3]), Path(sys.argv[4])

    def run_job(job: Job, source_dir: Path, progress) -> JobResult:
        print(f"RUNNING {job.id}", flush=True)
        started = time.monotonic()
        while mode == "block" or time.monotonic() - started < 1.5:
            progress(Progress(round=1, message="working"))
            time.sleep(0.05)
        return JobResult(job_id=job.id, ok=True, targets=[TargetResult(target=t.name, improved=False,
                                                                       message="drained") for t in job.targets])

    settings = WorkerSettings(bot_url=url, poll_seconds=0.1, heartbeat_seconds=0.3, drain_seconds=drain_s,
                              ready_file=ready)
    n = serve(Worker(settings, run_job=run_job))
    print("GAVE BACK" if n is None else f"DONE {n}", flush=True)


if __name__ == "__main__":
    main()
