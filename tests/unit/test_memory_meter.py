"""utils.PeakMemory: per-phase peak memory, measured (Linux VmHWM reset between phases)."""

from __future__ import annotations

import mmap

import pytest

from mmgpg.utils import PeakMemory

MIB = 2**20


def _touch(mib: int) -> None:
    """Make ``mib`` MiB resident, then give them back: an anonymous mapping of fresh pages, one byte written per page.
    Not a numpy array: after the rest of the suite the allocator may serve it from freed heap that is still
    resident (a raised mmap threshold), and the process's RSS would not grow at all (seen in CI: 2464 = 2464 MiB)."""
    with mmap.mmap(-1, mib * MIB) as block:
        for i in range(0, mib * MIB, mmap.PAGESIZE):
            block[i] = 1


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
