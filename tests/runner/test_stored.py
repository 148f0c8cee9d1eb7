"""A value kept on disk as JSON (runner.stored): computed once, read back by the next caller, recomputed where the
file is missing or unreadable, and not kept where the caller says so."""

from pydantic import BaseModel

from runner.stored import stored


class Value(BaseModel):
    n: int
    ok: bool = True


def test_a_stored_value_is_computed_once_and_read_back(tmp_path):
    calls = []
    path = tmp_path / "sub" / "k.json"

    def compute():
        calls.append(1)
        return Value(n=len(calls))

    assert stored(path, Value, compute) == Value(n=1)
    assert stored(path, Value, compute) == Value(n=1) and calls == [1]
    assert [p.name for p in path.parent.iterdir()] == ["k.json"]  # no temporary left beside it
    path.write_text("{not json")
    assert stored(path, Value, compute) == Value(n=2)  # unreadable: computed again, and kept
    assert Value.model_validate_json(path.read_text()) == Value(n=2)


def test_a_value_the_caller_does_not_keep_is_computed_again(tmp_path):
    path = tmp_path / "k.json"
    failed = stored(path, Value, lambda: Value(n=1, ok=False), keep=lambda v: v.ok)
    assert failed.ok is False and not path.exists()
    assert stored(path, Value, lambda: Value(n=2), keep=lambda v: v.ok) == Value(n=2) and path.exists()
