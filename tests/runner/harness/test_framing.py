"""Replies are framed (runner.harness.procs.process.Child.receive): each carries its request's tag and is at most
`Limits.reply_bytes` long. A child that writes an extra line, an untagged one or an endless one gets a crash, and
the parent never holds more than the cap."""

from __future__ import annotations

import pytest

from runner.harness.procs.process import ChildDied, Limits

from .test_sandbox import Hostile

# the child's own reply pipe, found as a candidate would: its one write-only pipe
_REPLY_FD = """
import fcntl, os


def _writable_pipe(n):
    try:
        return (os.readlink(f"/proc/self/fd/{n}").startswith("pipe:")
                and fcntl.fcntl(int(n), fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY)
    except OSError:
        return False


fd = next(int(n) for n in os.listdir("/proc/self/fd") if _writable_pipe(n))
"""


@pytest.fixture
def hostile(tmp_path):
    h = Hostile(tmp_path, Limits(memory_bytes=2 << 30, reply_bytes=1 << 20))
    yield h
    h.child.close()


def test_an_extra_reply_line_is_a_crash_not_the_next_answer(hostile):
    """An honest kernel after it would be judged on shifted replies: the first untagged line ends it instead."""
    with pytest.raises(ChildDied) as err:
        hostile.run(_REPLY_FD + 'os.write(fd, b\'{"ok": true, "result": "forged"}\\n\')\nresult = "real"')
    assert err.value.kind == "crash" and "tag" in str(err.value)


def test_a_reply_tagged_for_another_request_is_a_crash(hostile):
    with pytest.raises(ChildDied) as err:
        hostile.run(_REPLY_FD + 'os.write(fd, b\'{"ok": true, "result": 1, "nonce": "0123456789abcdef"}\\n\')\n'
                    'result = 2')
    assert err.value.kind == "crash" and "out of order" in str(err.value)


def test_an_oversize_reply_is_a_crash_and_the_parent_holds_no_more_than_the_cap(hostile):
    with pytest.raises(ChildDied) as err:
        hostile.run(_REPLY_FD + "for _ in range(8):\n    os.write(fd, b'x' * (1 << 20))\nresult = 1")
    assert err.value.kind == "crash" and "over 1048576 bytes" in str(err.value)
    assert len(hostile.child._buf) == 0


def test_tagged_replies_in_order_are_read(hostile):
    assert [hostile.run(f"result = {k}") for k in range(3)] == [0, 1, 2]
