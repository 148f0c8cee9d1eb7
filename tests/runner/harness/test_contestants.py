"""A trial's output files are deleted once the judge has read them (they live in /dev/shm, i.e. memory), and only
files inside the candidate's own directory are ever touched."""

from runner.harness.contestants import discard_outputs


def test_read_outputs_are_deleted_and_nothing_outside_the_candidate_dir(tmp_path):
    work = tmp_path / "cand"
    work.mkdir()
    a, b = work / "out_1_a_0.bin", work / "out_1_b_0.bin"
    outside = tmp_path / "elsewhere.bin"
    for f in (a, b, outside):
        f.write_bytes(b"\0" * 8)
    reply = {"outputs": [{"file": str(a)}, {"tensor": False}],
             "second_run": [{"file": str(b)}, {"file": str(outside)}, {"file": str(work / "../elsewhere.bin")}]}
    discard_outputs(work, reply)
    assert not a.exists() and not b.exists()
    assert outside.exists()
    discard_outputs(work, {"outputs": [{"file": str(a)}]})  # already gone: no error
