"""benchmarks/train_speed.py: what the parent passes to each timed child, and the exclusive stage clock."""
from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import load_benchmark


def _fake_child():
    """A stand-in for the child process: records its command and environment, writes an empty profile."""
    calls = []

    def run(cmd, env, check):
        calls.append((cmd, env))
        Path(cmd[cmd.index("--json-out") + 1]).write_text(json.dumps({}))

    return calls, run


def test_a_device_reference_times_this_tree_twice_with_each_device_and_keeps_the_python_path(monkeypatch, tmp_path):
    bench = load_benchmark("train_speed")
    calls, fake_run = _fake_child()
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.setenv("PYTHONPATH", "/somewhere/site")
    args = bench.argparse.Namespace(data="DATA", val_candidates=["A.json"], calibration_candidates=[], extra=None,
                                    device=None, model="dsokr", no_fragments=True)
    before = bench._run_tree(tmp_path, args, "before", "cpu")
    after = bench._run_tree(tmp_path, args, "after", "cuda")
    (cmd_before, _), (cmd_after, env_after) = calls
    assert cmd_before[cmd_before.index("--device") + 1] == "cpu"
    assert cmd_after[cmd_after.index("--device") + 1] == "cuda"
    for cmd in (cmd_before, cmd_after):
        assert cmd[cmd.index("--model") + 1] == "dsokr" and "--no-fragments" in cmd
    # the timed tree first (it must win over an installed copy), then the caller's path (packages put there)
    assert env_after["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/somewhere/site"]
    assert before["tree"] == after["tree"] == str(tmp_path)


def test_without_a_device_the_child_is_left_to_auto(monkeypatch, tmp_path):
    bench = load_benchmark("train_speed")
    calls, fake_run = _fake_child()
    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    args = bench.argparse.Namespace(data="DATA", val_candidates=["A.json"], calibration_candidates=[], extra=None,
                                    device=None, model=None, no_fragments=False)
    bench._run_tree(tmp_path, args, "after", None)
    (cmd, env), = calls
    assert "--device" not in cmd and "--model" not in cmd and "--no-fragments" not in cmd
    assert env["PYTHONPATH"] == str(tmp_path)


def test_the_clock_charges_nested_stages_exclusively_and_traces_slow_ones(monkeypatch, capsys):
    bench = load_benchmark("train_speed")
    clock = bench._Clock()
    now = {"t": 0.0}
    monkeypatch.setattr(bench.time, "perf_counter", lambda: now["t"])
    monkeypatch.setattr(bench.time, "process_time", lambda: now["t"])
    clock._mark, clock._start = (0.0, 0.0), 0.0
    monkeypatch.setenv("TRAIN_SPEED_TRACE", "1")
    syncs = []
    clock.synchronize = lambda: syncs.append(now["t"])
    clock.enter("model linear algebra")
    now["t"] = 2.0
    clock.enter("eigendecompositions")
    now["t"] = 2.5
    clock.leave("eigendecompositions")  # 0.5 s: under the trace's 1 s
    now["t"] = 6.0
    clock.leave("model linear algebra")
    assert clock.wall[("model linear algebra",)] == 5.5  # 2.0 before and 3.5 after the nested stage
    assert clock.wall[("model linear algebra", "eigendecompositions")] == 0.5
    assert len(syncs) == 4  # every boundary waits for the device's queued work
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["[trace      6.0 s] model linear algebra: 6.0 s"]
