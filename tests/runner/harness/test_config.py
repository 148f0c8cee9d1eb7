"""runner.harness.config: the settings a host may override by environment, validated where the harness is
configured."""

from __future__ import annotations

import pytest

from runner.harness.config import HarnessConfig, cpu_check_setting


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
