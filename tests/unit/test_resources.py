"""The CPU budget comes from the pod's cgroup quota (v1 and v2, the tightest ancestor wins), or from
CONVGATE_THREADS; never from the host's core count alone."""

from __future__ import annotations

import os

import pytest

from engine.resources import ThreadSettingError, cgroup_cpu_limit, cpu_budget

SCHEDULABLE = len(os.sched_getaffinity(0))


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_quota_of_the_process_group(tmp_path):
    _write(tmp_path / "kubepods/pod1/ctr/cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/kubepods/pod1/ctr\n") == 1.5


def test_v2_tightest_ancestor_wins(tmp_path):
    _write(tmp_path / "kubepods/pod1/cpu.max", "100000 100000\n")
    _write(tmp_path / "kubepods/pod1/ctr/cpu.max", "max 100000\n")
    _write(tmp_path / "cpu.max", "400000 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/kubepods/pod1/ctr\n") == 1.0


def test_v2_unlimited_is_none(tmp_path):
    _write(tmp_path / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/\n") is None


def test_v1_cfs_quota(tmp_path):
    _write(tmp_path / "cpu,cpuacct/kubepods/pod2/cpu.cfs_quota_us", "50000\n")
    _write(tmp_path / "cpu,cpuacct/kubepods/pod2/cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    proc = "4:memory:/kubepods/pod2\n3:cpu,cpuacct:/kubepods/pod2\n"
    assert cgroup_cpu_limit(tmp_path, proc) == 0.5


def test_budget_rounds_a_fractional_quota_up_and_caps_by_schedulable_cpus(tmp_path):
    _write(tmp_path / "cpu.max", "50000 100000\n")
    assert cpu_budget({}, tmp_path, "0::/\n") == 1
    _write(tmp_path / "cpu.max", f"{(SCHEDULABLE + 7) * 100000} 100000\n")
    assert cpu_budget({}, tmp_path, "0::/\n") == SCHEDULABLE


def test_budget_without_quota_is_the_schedulable_cpus(tmp_path):
    assert cpu_budget({}, tmp_path, "0::/\n") == SCHEDULABLE


def test_the_setting_overrides_the_quota(tmp_path):
    _write(tmp_path / "cpu.max", "100000 100000\n")
    assert cpu_budget({"CONVGATE_THREADS": "3"}, tmp_path, "0::/\n") == 3


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_a_bad_setting_is_refused(tmp_path, bad):
    with pytest.raises(ThreadSettingError, match="CONVGATE_THREADS"):
        cpu_budget({"CONVGATE_THREADS": bad}, tmp_path, "0::/\n")


@pytest.mark.parametrize("line", ["0 100000", "-1 100000", "100000 0", "100000 -5"])
def test_v2_a_zero_or_negative_quota_or_period_is_no_limit(tmp_path, line):
    """Not a division by zero and not a negative CPU count: the kernel never writes these, a broken
    mount or a test harness might."""
    _write(tmp_path / "cpu.max", line + "\n")
    assert cgroup_cpu_limit(tmp_path, "0::/\n") is None


def test_v2_a_quota_below_one_microsecond_per_period_is_still_a_limit(tmp_path):
    _write(tmp_path / "cpu.max", "1 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/\n") == pytest.approx(1e-5)
