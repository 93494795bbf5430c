"""Each benchmark engine starts, runs for a second or two, and writes a
well-formed report that says what it measured."""
import os
import sys

from conftest import BENCH, connect, report, run

sys.path.insert(0, BENCH)
import torture_rounds  # noqa: E402

RUN = os.path.join(BENCH, "run")
TORTURE = os.path.join(BENCH, "torture")
PYTHON = sys.executable


def test_matrix_runs_every_mode_and_reports_it(tmp_path, pgkvx_version):
    run(RUN, "--workloads", "kvS70-L1", "--modes", "plain,latched-off,optimistic",
        "--duration", 1, "--reps", 1, "--keys", 1000, "--clients", 2, "--jobs", 1, "--out", tmp_path)
    data, md, base = report(tmp_path, "")
    assert data["machine"]["pgkvx_version"] == pgkvx_version
    assert f"pgkvx {pgkvx_version}" in md
    runs = {r["mode"]: r for r in data["kv"]}
    assert set(runs) == {"plain", "latched-off", "optimistic"}, data["kv"]
    for mode, r in runs.items():
        assert r["tps"] > 0 and r["transactions"] > 0, (mode, r)
        assert r["rc"] == 0 and r["errors"] == [], (mode, r)
    # Only the registered table's writes take latches.
    assert runs["plain"]["stats"].get("latches_acquired", 0) == 0, runs["plain"]["stats"]
    assert runs["latched-off"]["stats"]["latches_acquired"] > 0, runs["latched-off"]["stats"]
    assert runs["optimistic"]["stats"]["scans_optimistic"] > 0, runs["optimistic"]["stats"]
    plans = data["plans"]["kvS70-L1"]
    assert plans["plain"] == "plain" and plans["optimistic"] == "PgkvxLimitScan", plans
    for label in ("plain PG", "latched, off", "optimistic"):
        assert f"| kvS70-L1 | {label} |" in md, label
    with open(base + ".png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # report.py renders the same report again from the JSON alone.
    run(PYTHON, os.path.join(BENCH, "report.py"), base + ".json")
    with open(base + ".md") as f:
        assert f.read() == md


def test_tail_runs_every_scenario_and_reports_no_skip_under_pgkvx(tmp_path):
    run(RUN, "--workloads", "tail", "--modes", "plain,optimistic", "--quick",
        "--tail-duration", 1, "--tail-reps", 1, "--out", tmp_path)
    data, md, _ = report(tmp_path, "")
    runs = {(r["scenario"], r["mode"]): r for r in data["tail"]}
    assert set(runs) == {(s, m) for s in ("steady", "idle-in-tx") for m in ("plain", "optimistic")}
    for key, r in runs.items():
        assert "error" not in r and r["errors"] == [], (key, r)
        assert r["committed"] > 0 and r["delivered_per_s"] > 0, (key, r)
    for scenario in ("steady", "idle-in-tx"):
        r = runs[(scenario, "optimistic")]
        assert r["scan_node"] == "PgkvxLimitScan", r
        assert r["skipped"] == 0 and not r["drain_timed_out"], r
    assert "## tail consumers" in md and "| idle-in-tx | optimistic |" in md


def test_paired_runs_the_key_draw_pair_at_64_clients(tmp_path):
    run(RUN, "--paired", "--pairs", "kv0:plain,append:gapless", "--rounds", 1, "--duration", 1,
        "--clients", 64, "--keys", 1000, "--out", tmp_path)
    data, md, _ = report(tmp_path, "-paired")
    assert data["config"]["clients"] == 64 and data["config"]["clients_per_side"] == 32
    pairs = {(p["workload"], p["mode"]): p for p in data["pairs"]}
    assert set(pairs) == {("kv0", "plain"), ("append", "gapless")}
    for key, p in pairs.items():
        (r,) = p["rounds"]
        assert r["errors"] == [], (key, r)
        assert r["plain_tps"] > 0 and r["mode_tps"] > 0 and r["ratio"] > 0, (key, r)
        assert p["summary"]["n"] == 1, p
    # The gapless side drew its keys through next_key; the kv control
    # registered nothing.
    assert pairs[("append", "gapless")]["rounds"][0]["stats"]["keys_drawn"] > 0
    assert pairs[("kv0", "plain")]["rounds"][0]["stats"].get("latches_acquired", 0) == 0
    assert ("| append | gapless (pgkvx.next_key default) | plain PG (nextval default) | 64 | 1 | "
            in md), md


def test_paired_refuses_more_clients_than_the_server_admits(tmp_path):
    with connect() as c:
        limit = int(c.execute("SHOW max_connections").fetchone()[0])
    r = run(RUN, "--paired", "--pairs", "append:gapless", "--clients", 2 * limit, "--rounds", 1,
            "--duration", 1, "--out", tmp_path, expect_rc=1)
    assert "max_connections" in r.stderr, r.stderr


def test_paired_refuses_a_mode_its_workload_does_not_have(tmp_path):
    r = run(RUN, "--paired", "--pairs", "append:optimistic", "--out", tmp_path, expect_rc=1)
    assert "bad pair 'append:optimistic'" in r.stderr, r.stderr


def test_torture_runs_its_rounds_and_reports_what_it_checked(tmp_path):
    run(TORTURE, "--seconds", 2, "--rounds", 2, "--seed", 7, "--writers", 2, "--out", tmp_path)
    data, md, _ = report(tmp_path, "-torture")
    rounds = data["rounds"]
    assert [r["seed"] for r in rounds] == [7, 8]
    for r in rounds:
        assert r["ok"] and r["errors"] == [], r["summary"]
        assert r["writer_txns"] > 0 and r["committed_rows"] > 0, r["summary"]
        assert r["polls"] > 0 and sum(r["polls_by_consumer"].values()) >= r["polls"], r
        assert set(r["polls_by_consumer"]) == set(r["delivered_by_consumer"]), r
        assert sum(r["skipped"].values()) == sum(r["phantoms"].values()) == r["disorder_count"] == 0
    assert "**Oracle: nothing found**" in md
    for section in ("## Totals", "## Writer transactions by kind", "## Consumers by kind", "## Rounds"):
        assert section in md, section


def test_torture_report_names_what_the_oracle_found(tmp_path):
    bad = {"seed": 1, "elapsed_s": 1.0, "ok": False, "writer_txns": 3, "writer_rollbacks": 0,
           "writer_retries": 0, "writer_kinds": {"insert": 3}, "polls": 5, "consumer_retries": 0,
           "polls_by_consumer": {"tail/optimistic": 5}, "delivered_by_consumer": {"tail/optimistic": 1},
           "committed_rows": 3, "protocol": {}, "stats": {},
           "skipped": {"tail/optimistic": 2}, "skipped_sample": {"tail/optimistic": [2, 3]},
           "phantoms": {"tail/optimistic": 0}, "phantoms_sample": {}, "disorder": [],
           "disorder_count": 0, "errors": [], "summary": ""}
    machine = {"nproc": 2, "cpu": "x", "ram_gib": 1, "postgres": "PostgreSQL 15", "loadavg": 0.0,
               "pgkvx_version": "0", "pgkvx_library": "x", "harness_commit": "x", "settings": {}}
    md = torture_rounds.render({"started": "now", "machine": machine, "rounds": [bad],
                                "config": {"seconds": 1, "seed": 1, "rounds": 1, "writers": 1}})
    assert "**Oracle: FAILED** — skipped rows 2," in md, md
    assert "| tail/optimistic | 5 | 1 | 2 | 0 |" in md, md
    assert "tail/optimistic: skipped [2, 3]" in md, md


def test_neighbours_runs_every_kind_beside_the_plain_table(tmp_path):
    run(RUN, "--neighbours", "--seconds", 1, "--modes", "optimistic", "--out", tmp_path)
    data, md, _ = report(tmp_path, "-neighbours")
    rows = data["modes"]["optimistic"]
    kinds = {r["kind"] for r in rows}
    assert {"newest first", "max(id)", "relay DELETE ... RETURNING", "FOR UPDATE batch"} <= kinds, kinds
    assert {r["table"] for r in rows} == {"nb_latched", "nb_plain"}
    for r in rows:
        assert r["statements"] > 0, r
        if r["table"] == "nb_latched" and r.get("consumer"):
            assert r["skipped"] == 0 and r["duplicates"] == 0, r
    assert "## `pgkvx.scan_mode = optimistic`" in md


def test_instructions_counts_each_mode_against_the_plain_table(tmp_path):
    # Twenty statements a cell only show the table is whole and the
    # cells ordered where the order does not depend on warm-up: a
    # protected read (a span checked, a latch table looked at) does the
    # plain read's work and thousands of instructions more.  How off,
    # optimistic and fenced compare are gaps of a few hundred to a
    # thousand or two instructions, within what the first executions of a
    # cell warm up (catalog caches, the switch to a generic plan) at this
    # count: at twenty, off has come out below plain.  bench/README gives
    # them from 1000 statements a cell.
    run(os.path.join(BENCH, "instructions"), "--limits", 1, "--statements", 20, "--writes", "--out", tmp_path)
    (name,) = os.listdir(tmp_path)
    assert name.endswith("-instructions.md"), name
    with open(os.path.join(tmp_path, name)) as f:
        md = f.read()
    assert "bench/instructions --limits 1 --statements 20 --writes" in md, md
    (row,) = [line for line in md.splitlines() if line.startswith("| 1 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 5, row
    plain = int(cells[1])
    off, optimistic, fenced = (int(c.split()[0]) for c in cells[2:])
    assert plain > 0 and off > 0 and fenced > 0, row
    assert plain < min(optimistic, fenced), row
    # The writers' table: a cell per write, and a gapless insert (a latch,
    # its WAL record and the draw, a quarter more than the plain insert)
    # above the nextval insert.
    writes = {}
    for line in md.splitlines():
        parts = [c.strip() for c in line.strip("|").split("|")]
        if len(parts) == 3 and parts[0] in ("upsert", "append"):
            writes[parts[0]] = (int(parts[1]), int(parts[2].split()[0]))
    assert set(writes) == {"upsert", "append"}, md
    assert all(p > 0 and l > 0 for p, l in writes.values()), writes
    assert writes["append"][1] > writes["append"][0], writes
