"""The wake-up workload: its oracle and lag statistics on known inputs, one
short run of every consumer kind, and pgqd gone after an interrupted run."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import BENCH, ENGINE_TIMEOUT, connect, report, run

sys.path.insert(0, BENCH)
import wake  # noqa: E402

RUN = os.path.join(BENCH, "run")


def test_oracle_names_a_skipped_id():
    got = wake.oracle({1, 2, 3, 4, 5}, [1, 2, 4, 5])
    assert got["skipped"] == 1 and got["skipped_sample"] == [3], got
    assert got["phantoms"] == 0 and got["duplicates"] == 0, got


def test_oracle_names_phantoms_and_duplicates():
    got = wake.oracle({1, 2, 3}, [1, 2, 2, 3, 9])
    assert got["skipped"] == 0, got
    assert got["phantoms"] == 1 and got["phantoms_sample"] == [9], got
    assert got["duplicates"] == 1, got


def test_lag_counts_first_delivery_from_own_commit_and_in_key_order():
    # id 2 commits 10 ms after id 3: in key order id 3 may only be
    # delivered once id 2 has committed.
    commit = {1: 100.000, 2: 100.010, 3: 100.002, 4: None}
    ids = [1, 3, 2, 1, 4]
    times = [100.001, 100.012, 100.011, 100.500, 100.600]
    got = wake.lag_stats(commit, ids, times)
    assert got["lag_n"] == 3, got                       # id 4 has no timestamp
    assert got["lag_max_ms"] == pytest.approx(10.0)      # id 3, own commit; the re-delivery of 1 ignored
    assert got["lag_p50_ms"] == pytest.approx(1.0)
    assert got["inorder_max_ms"] == pytest.approx(2.0)   # id 3, from id 2's commit
    assert got["inorder_p50_ms"] == pytest.approx(1.0)
    assert got["lag_p99_ms"] == pytest.approx(1.0 + 0.98 * 9.0)


def test_parse_config_reads_producers_rows_and_delay():
    assert wake.parse_config("8x1, 64x10@0") == [(8, 1, 5.0), (64, 10, 0.0)]


def test_producer_scripts_wake_each_kind_their_way():
    assert "pg_notify" in wake.producer_script("notify", "t")
    assert "pgq.insert_event" in wake.producer_script("pgq", "t")
    plain = wake.producer_script("plain", "t")
    assert "pg_notify" not in plain and "pgq" not in plain
    assert plain.index("\\sleep") < plain.index("COMMIT")   # commits land out of key order


def _pgq_ready():
    with connect() as c:
        ok, _ = wake.pgq_available(c)
    return ok


def _pgqd_pids():
    """pgqd processes started by the benchmark (their ini lives in a
    pgkvx-pgqd-* directory)."""
    r = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True)
    return [ln.split()[0] for ln in r.stdout.splitlines() if "pgqd" in ln and "pgkvx-pgqd-" in ln]


def _track_commit_timestamp():
    with connect() as c:
        return c.execute("SHOW track_commit_timestamp").fetchone()[0]


def test_wake_runs_every_kind_and_reports_it(tmp_path):
    before = _track_commit_timestamp()
    run(RUN, "--workloads", "wake", "--quick", "--wake-duration", 1, "--wake-configs", "4x1",
        "--wake-waiters", 5, "--out", tmp_path)
    data, md, base = report(tmp_path, "")
    w = data["wake"]
    kinds = {c["kind"]: c for c in w["cells"] if c["scenario"] == "steady"}
    expect = set(wake.KIND_NAMES) - ({"pgq"} if w["pgq_missing"] else set())
    assert set(kinds) == expect, (set(kinds), w["pgq_missing"])
    for c in w["cells"]:
        assert "error" not in c and c["errors"] == [], c
        assert c["committed"] > 0 and c["delivered"] == c["committed"], c
        assert c["skipped"] == c["phantoms"] == c["duplicates"] == 0, c
        assert c["lag_n"] == c["committed"] and c["lag_p50_ms"] >= 0, c
    assert kinds["wait_for"]["wakeups"] > 0 and kinds["wait_for"]["stats"]["wait_for_calls"] > 0
    assert {c["scenario"] for c in w["cells"]} == {"steady", "idle-in-tx"}
    pairs = {p["condition"]: p for p in w["pairs"]}
    assert set(pairs) == {"none", "1-same", "100-same", "100-other"}, w["pairs"]
    for cond, p in pairs.items():
        assert "error" not in p and p["tps_a"] > 0 and p["tps_b"] > 0, p
    assert pairs["100-same"]["waiting_at_start"] == 5 and pairs["1-same"]["waiting_at_start"] == 1
    assert len([k for k in w["keepup"] if "error" not in k]) == 4, w["keepup"]
    assert "## wake-ups: consumers side by side" in md and "### Wake-up goals for (d)" in md
    assert "| steady | 4 × 1-row, 0–5 ms | (d) pgkvx.wait_for |" in md, md
    if w["pgq_missing"]:
        assert "**PgQ left out**" in md
    with open(base + ".png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not _pgqd_pids()
    assert _track_commit_timestamp() == before


def test_interrupted_wake_run_stops_pgqd_and_resets_the_server(tmp_path):
    if not _pgq_ready():
        pytest.skip("PgQ is not installed (scripts/bootstrap installs it)")
    before = _track_commit_timestamp()
    cmd = [RUN, "--workloads", "wake", "--wake-kinds", "pgq", "--wake-duration", 60,
           "--wake-configs", "2x1", "--wake-pair-rounds", 0, "--wake-keepup-rounds", 0, "--out", tmp_path]
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        deadline = time.monotonic() + 60
        while not _pgqd_pids() and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.2)
        assert _pgqd_pids(), "pgqd never started"
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=ENGINE_TIMEOUT)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, out[-2000:]
    assert not _pgqd_pids(), "pgqd outlived the interrupted run"
    assert _track_commit_timestamp() == before
    # Interrupted in its first cell, the report has no table to check.
    (found,) = glob.glob(os.path.join(tmp_path, "*.json"))
    with open(found) as f:
        assert json.load(f)["interrupted"]
    with open(found[:-len(".json")] + ".md") as f:
        assert "**Interrupted**" in f.read()


def test_wake_latency_counts_waits_a_commit_ended():
    commit = {1: 10.000, 2: 10.004, 3: 10.0061, 4: None}
    waits = [(9.985, 9.990, 10.001),     # woken 1 ms after id 1
             (9.975, 9.980, 9.985),      # ended before any commit: left out
             (10.0005, 10.002, 10.0045),  # woken 0.5 ms after id 2
             (9.999, 10.005, 10.0062)]   # id 2 committed after its read began: left out
    got = wake.wake_latency(commit, waits)
    assert got["wake_n"] == 2, got
    assert got["wake_p50_ms"] == pytest.approx(0.75)
    assert got["wake_p99_ms"] == pytest.approx(0.5 + 0.99 * 0.5)
