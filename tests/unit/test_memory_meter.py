"""utils.PeakMemory: per-phase peak memory, measured (Linux VmHWM reset between phases)."""

from __future__ import annotations

import numpy as np
import pytest

from mmgpg.utils import PeakMemory

MIB = 2**20


def _touch(mib: int) -> None:
    block = np.ones(mib * MIB // 8)  # written, so resident
    block[:] = 2.0
    del block


def test_each_phase_sees_its_own_peak_and_nested_phases_fold_into_the_outer_one():
    meter = PeakMemory()
    if not meter.resettable:
        pytest.skip("this kernel does not let a process reset its peak RSS (/proc/self/clear_refs)")
    with meter.phase("big"):
        _touch(300)
    with meter.phase("small"):
        _touch(20)
    big, small = meter.last["memory/big_rss_mib"], meter.last["memory/small_rss_mib"]
    # the 300 MiB block is freed after "big": "small" must not inherit its peak (the reset works)
    assert big - small > 200, (big, small)
    with meter.phase("update"):
        _touch(300)
        with meter.phase("sync"):
            _touch(20)
    update, sync = meter.last["memory/update_rss_mib"], meter.last["memory/sync_rss_mib"]
    # the outer phase keeps the peak it reached before the inner one reset the counters
    assert update - sync > 200 and update >= big - 50, (update, sync, big)
