"""The process busy figure (issue 23): the whole process's CPU per second sets the lease ceiling, and the grant
ramp bounds how fast leases are taken on before their renewals show their cost. Unit tests with injected clocks
(the wall clock and the process's CPU clock advanced by hand); the P4 benchmark measures the effect
(docs/benchmarks.md)."""

from __future__ import annotations

import argparse

import pytest
from prometheus_client import CollectorRegistry

import fencepost.client as fc
from fencepost.coordinator.admission.capacity import (BACKOFF, LOW_MARK, MAX_RAISE, MIN_PROCESS_CEILING, MIN_RAMP,
                                                       RAISE, RAISE_SECONDS, WINDOWS, Capacity)
from fencepost.coordinator.admission.limits import FLAGS, Limits, add_limit_arguments, limits_from_args
from fencepost.coordinator.admission.overload import LoopLag
from fencepost.coordinator.telemetry.metrics import LockMetrics


class Process:
    """A coordinator process as the test sets it: its wall clock, CPU clock and leases kept."""

    def __init__(self, kept: int, metrics: LockMetrics | None = None) -> None:
        self.wall = self.cpu = 0.0
        self.kept = kept
        self.capacity = Capacity(Limits(max_loop_busy=0, max_client_rtt=0, max_keepalive_wait=0, max_lag=0),
                                 clock=lambda: self.wall, cpu_clock=lambda: 0.0,
                                 process_clock=lambda: self.cpu, window=1.0)
        if metrics is None:
            self.capacity.follow(LoopLag(ticks=1), kept=lambda: self.kept)
        else:
            self.capacity.follow(LoopLag(ticks=1), metrics, kept=lambda: self.kept)

    def windows(self, busy: float, count: int = 1) -> None:
        """``count`` windows of 1 s in which the process used ``busy`` CPU seconds each."""
        for _ in range(count):
            self.wall += 1.0
            self.cpu += busy
            self.capacity.tick()

    def refused(self, call: str = "LeaseGrant", lease: bool = True) -> str:
        """The message of the refusal of ``call`` ("" when admitted)."""
        try:
            self.capacity.admit(call, lease=lease)
        except fc.ResourceExhausted as refused:
            assert refused.reason == "OVERLOADED" and refused.retry_delay == 1.0
            return str(refused)
        return ""


def test_a_busy_process_sets_the_ceiling_and_refuses_only_new_leases() -> None:
    """Sustained at --max-process-busy (0.9): the ceiling is BACKOFF of the leases carried; LeaseGrant is refused
    at it, while new streams and waits are admitted (the condition is not entered); one busy window does not
    count (the smallest of WINDOWS)."""
    process = Process(kept=4000)
    process.windows(0.3, WINDOWS)
    process.windows(0.95, WINDOWS - 1)
    process.windows(0.3)
    assert process.capacity.ceiling is None
    process.windows(0.95, WINDOWS)
    assert process.capacity.ceiling == int(BACKOFF * 4000) and not process.capacity.overloaded
    assert "lease ceiling (3600 leases" in process.refused()
    assert process.refused("KeepAlive", lease=False) == "" and process.refused("Acquire", lease=False) == ""
    process.windows(0.95, 3)
    assert process.capacity.ceiling == 3600  # carried did not change: not lowered again and again
    process.kept = 3000  # leases ended while the process stayed busy
    process.windows(0.95)
    assert process.capacity.ceiling == int(BACKOFF * 3000)


def test_a_process_busy_with_few_leases_keeps_a_ceiling_of_a_thousand() -> None:
    """Busy with 50 leases (lock cycles as fast as they come): the ceiling is MIN_PROCESS_CEILING, not 45, so
    the callers of a coordinator busy with other work still get leases."""
    process = Process(kept=50)
    process.windows(0.97, WINDOWS)
    assert process.capacity.ceiling == MIN_PROCESS_CEILING
    assert process.refused() == ""


def test_the_ceiling_rises_in_proportion_to_the_room_left() -> None:
    """After RAISE_SECONDS in which a grant was refused at the ceiling, it rises by LOW_MARK * mark / busiest
    window: doubled at most (MAX_RAISE), RAISE at least, and not at all at or above the low mark."""
    process = Process(kept=2000)
    process.windows(0.95, WINDOWS)
    assert process.capacity.ceiling == 1800
    process.kept = 1800
    assert process.refused()
    process.windows(0.2, int(RAISE_SECONDS) + 1)  # far below: doubled
    assert process.capacity.ceiling == int(1800 * MAX_RAISE) + 1 == 3601
    process.kept = 3601
    assert process.refused()
    process.windows(0.6, int(RAISE_SECONDS) + 1)
    assert process.capacity.ceiling == int(3601 * max(RAISE, LOW_MARK * 0.9 / 0.6)) + 1 == 4322
    process.kept = 4322
    assert process.refused()
    process.windows(0.8, 3 * int(RAISE_SECONDS))  # at the low mark (0.72) or above: no rise
    assert process.capacity.ceiling == 4322


def test_the_grant_ramp_bounds_leases_taken_on_before_their_renewals_show() -> None:
    """Leases granted in the last RAISE_SECONDS stay below the ramp: kept * (LOW_MARK * mark / busiest - 1), at
    least MIN_RAMP; refused OVERLOADED beyond it; admitted again once those grants are older."""
    process = Process(kept=4000)
    process.windows(0.36, WINDOWS)  # room to double: 4000 more
    assert process.capacity.ramp == pytest.approx(4000 * (LOW_MARK * 0.9 / 0.36 - 1))
    for _ in range(3999):
        process.capacity.granted()
    assert process.refused() == ""
    process.capacity.granted()
    assert "granting leases faster than their renewals show their cost (4000 in the last 5 s)" in process.refused()
    assert process.refused("KeepAlive", lease=False) == ""
    process.windows(0.36, int(RAISE_SECONDS) + 1)
    assert process.refused() == ""
    idle = Process(kept=0)
    idle.windows(0.01, WINDOWS)
    assert idle.capacity.ramp == MIN_RAMP


def test_the_process_busy_is_a_metric_and_a_flag_that_turns_it_off() -> None:
    """fencepost_process_busy_ratio follows the figure; --max-process-busy 0 turns the ceiling and the ramp off."""
    registry = CollectorRegistry()
    process = Process(kept=10, metrics=LockMetrics(registry))
    process.windows(0.5, WINDOWS)
    assert registry.get_sample_value("fencepost_process_busy_ratio") == pytest.approx(0.5)
    parser = argparse.ArgumentParser()
    add_limit_arguments(parser, lambda flag, default: default)
    assert FLAGS["max_process_busy"] == "max-process-busy"
    assert limits_from_args(parser.parse_args(["--max-process-busy", "0"])).max_process_busy == 0
    assert limits_from_args(parser.parse_args(["--max-process-busy", "1.5"])).max_process_busy == 1.5
    assert limits_from_args(parser.parse_args([])).max_process_busy == 0.9
    with pytest.raises(ValueError, match="--max-process-busy is -1"):
        Limits(max_process_busy=-1)
    off = Capacity(Limits(max_process_busy=0), clock=lambda: 0.0, process_clock=lambda: 0.0)
    assert off.ramp == float("inf")
