"""bench/fingerprint_cost.py: one row per size, a time for every path the device has (the CPU's steps in cache
among them) and a read of the output for scale."""

from __future__ import annotations

import logging
import re
import sys

import bench.fingerprint_cost as cost


def test_a_row_per_size_with_a_time_for_every_path(monkeypatch, caplog):
    monkeypatch.setattr(sys, "argv", ["fingerprint_cost.py", "--device", "cpu", "--dtype", "float32", "--reps", "2",
                                      "--sizes", "4099,20000"])
    with caplog.at_level(logging.INFO, logger="fingerprint_cost"):
        cost.main()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[1] == "| elements | of | few_ops | few_reads | in_cache | sum |"
    rows = [line for line in lines if re.match(r"\| \d+ \|", line)]
    assert [r.split(" | ")[0] for r in rows] == ["| 4099", "| 20000"]
    assert all(len(re.findall(r"\d+\.\d{3}", r)) == 5 for r in rows), rows
