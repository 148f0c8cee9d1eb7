"""runner.harness.config: the settings a host may override by environment, validated where the harness is
configured."""

from __future__ import annotations

import os

import pytest

from runner.harness.config import HarnessConfig, confirm_rounds_setting, cpu_check_setting, timer_setting


def test_the_cpu_cross_checks_span_is_400_ms_unless_the_host_sets_one(monkeypatch):
    monkeypatch.delenv("FUSEBOT_CPU_CHECK_MS", raising=False)
    assert HarnessConfig().cpu_check_ms == 400.0
    monkeypatch.setenv("FUSEBOT_CPU_CHECK_MS", "150")
    assert HarnessConfig().cpu_check_ms == 150.0
    assert HarnessConfig(cpu_check_ms=250.0).cpu_check_ms == 250.0  # a configuration's own value wins


@pytest.mark.parametrize("raw", ["50", "0", "-1", "fast", "nan"])
def test_a_cpu_cross_check_under_ten_cpu_time_ticks_is_refused(raw):
    with pytest.raises(ValueError, match="FUSEBOT_CPU_CHECK_MS must be a number of milliseconds, at least 100"):
        cpu_check_setting({"FUSEBOT_CPU_CHECK_MS": raw})


def test_the_timer_cap_is_read_from_the_environment_and_validated(monkeypatch):
    monkeypatch.delenv("FUSEBOT_TIMER_MAX_SECONDS", raising=False)
    assert HarnessConfig().timer == {}  # the timer's own cap
    monkeypatch.setenv("FUSEBOT_TIMER_MAX_SECONDS", "1.5")
    assert HarnessConfig().timer == {"max_seconds": 1.5}
    assert HarnessConfig(timer={"max_reps": 7}).timer == {"max_reps": 7}  # a configuration's own value wins
    for raw in ("0", "-1", "soon", "nan"):
        with pytest.raises(ValueError, match="FUSEBOT_TIMER_MAX_SECONDS must be a positive number of seconds"):
            timer_setting({"FUSEBOT_TIMER_MAX_SECONDS": raw})


def test_the_confirmation_rounds_are_five_unless_the_host_sets_two_or_more():
    assert confirm_rounds_setting({}) == 5 and confirm_rounds_setting({"FUSEBOT_CONFIRM_ROUNDS": ""}) == 5
    assert confirm_rounds_setting({"FUSEBOT_CONFIRM_ROUNDS": "2"}) == 2
    assert confirm_rounds_setting({"FUSEBOT_CONFIRM_ROUNDS": "9"}) == 9
    for raw in ("1", "0", "-3", "2.5", "many", "nan"):
        with pytest.raises(ValueError, match="FUSEBOT_CONFIRM_ROUNDS must be a whole number of rounds, at least 2"):
            confirm_rounds_setting({"FUSEBOT_CONFIRM_ROUNDS": raw})


@pytest.mark.timing
def test_a_timing_test_runs_with_the_products_own_timer():
    assert "FUSEBOT_TIMER_MAX_SECONDS" not in os.environ and HarnessConfig().timer == {}
