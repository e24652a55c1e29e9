"""The device's plans on disk (tpuc/plan_store.py): kept under their size limit, least recently
used first; the files of others left alone. (The plans' use across processes is tested in
test_device.py.)"""
import os

from tpuc import plan_store


def test_pruning_removes_the_least_recently_used_plans_down_to_nine_tenths_of_the_limit(tmp_path):
    for k in range(10):
        path = tmp_path / f"{k:064x}.plan"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 + k, 1000 + k))  # plan 0 used longest ago
    (tmp_path / "notes.txt").write_bytes(b"y" * 5000)
    plan_store.prune(str(tmp_path), 1000)  # 10 plans of 100 bytes: at the limit, none goes
    assert len(list(tmp_path.glob("*.plan"))) == 10
    plan_store.prune(str(tmp_path), 800)
    left = sorted(p.name for p in tmp_path.glob("*.plan"))
    assert left == [f"{k:064x}.plan" for k in range(3, 10)]  # down to 720 bytes, the oldest gone
    assert (tmp_path / "notes.txt").exists()


def test_pruning_a_missing_directory_does_nothing(tmp_path):
    plan_store.prune(str(tmp_path / "missing"), 10)
