"""The background loop's pieces that the other tests reach only indirectly."""

from __future__ import annotations

import multiprocessing
import time

from bot.web.tasks import PipeWake


def test_pipe_wake_signals_and_never_blocks():
    reader, writer = multiprocessing.Pipe(duplex=False)
    waiter, waker = PipeWake(reader=reader), PipeWake(writer=writer)
    assert waiter.wait(0) is False
    waker.set()
    assert waiter.wait(1) is True
    waiter.clear()
    assert waiter.wait(0) is False
    t0 = time.monotonic()
    for _ in range(100_000):  # far more than the pipe holds: set() must not block once it is full
        waker.set()
    assert time.monotonic() - t0 < 5 and waiter.wait(0)
    waiter.clear()
    reader.close()
    waker.set()  # the reader is gone (the background process died): no error, no block
