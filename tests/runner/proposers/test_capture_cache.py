"""A module's captured graph kept on disk: a second search of the same module does not capture it again; another
source, or a failed capture, is captured anew."""

from __future__ import annotations

from runner.catalog.capture import CGraph
from runner.proposers.capture_cache import cached_capture, capture_key


class Counting:
    def __init__(self, graph: CGraph) -> None:
        self.graph, self.sources = graph, []

    def __call__(self, source: str) -> CGraph:
        self.sources.append(source)
        return self.graph


def test_a_captured_graph_is_read_back_not_captured_again(tmp_path):
    capture = Counting(CGraph(n_inputs=1, params=["gain"]))
    first = cached_capture("class Model: ...", cache_dir=tmp_path, capture=capture)
    again = cached_capture("class Model: ...", cache_dir=tmp_path, capture=capture)
    assert capture.sources == ["class Model: ..."] and again == first and again.params == ["gain"]
    cached_capture("class Other: ...", cache_dir=tmp_path, capture=capture)
    assert capture.sources == ["class Model: ...", "class Other: ..."]


def test_a_failed_capture_is_not_kept(tmp_path):
    capture = Counting(CGraph(unsupported="capture timed out after 120 s"))
    for _ in range(2):
        assert cached_capture("class Model: ...", cache_dir=tmp_path, capture=capture).unsupported
    assert len(capture.sources) == 2 and not list((tmp_path / "capture").glob("*.json"))


def test_the_key_follows_the_source_and_torchs_version():
    keys = {capture_key("a", "2.7.0"), capture_key("b", "2.7.0"), capture_key("a", "2.8.0")}
    assert len(keys) == 3 and capture_key("a", "2.7.0") in keys
