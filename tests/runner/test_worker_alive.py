import os
import time

from runner.worker import Worker, WorkerSettings


def test_the_poll_loop_touches_the_alive_file_even_when_the_bot_is_down(tmp_path):
    alive = tmp_path / "state" / "alive"
    settings = WorkerSettings(bot_url="http://127.0.0.1:9", token="t" * 32, alive_file=alive, poll_seconds=0.1)
    before = time.time()
    Worker(settings).run(once=True)  # the bot is unreachable: one poll, then out
    assert alive.exists() and os.path.getmtime(alive) >= before - 1
