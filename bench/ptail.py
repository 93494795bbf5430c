"""The partitioned tail workload: consumers polling a partitioned events
table by key, `SELECT * FROM events WHERE id > :c ORDER BY id LIMIT 100`.

`events (id bigserial, created_at timestamptz, payload text, PRIMARY KEY
(id, created_at)) PARTITION BY RANGE (created_at)`, with 2, 12 or 100
partitions (workloads ptail2, ptail12, ptail100) of equal time ranges and
rows whose created_at grows with id, as an event table partitioned by time
has them.  The tail reads every partition through a MergeAppend of their
primary key index scans.  Modes: `plain` leaves the table unregistered and
reads with pgkvx.scan_mode = off (PostgreSQL's own plan); `optimistic` and
`fenced` register it with `pgkvx.enable('events', gapless => true)` and read
in that mode, every partition's scan guarded under the parent's latches;
`off` registers it and reads with the protocol off.
Paired side by side (`bench/run --paired --pairs ptail12:optimistic`) their
throughput ratio is what protecting a partitioned tail costs.
"""
from dataclasses import dataclass

ROWS = 100_000
WORKLOADS = ["ptail2", "ptail12", "ptail100"]
DESCRIPTION = "tail reads of a table partitioned by created_at"


@dataclass(frozen=True)
class Mode:
    name: str
    label: str
    latched: bool
    scan_mode: str


MODES = [
    Mode("plain", "plain PG (partitioned, not latched)", False, "off"),
    Mode("optimistic", "latched parent, optimistic", True, "optimistic"),
    Mode("fenced", "latched parent, fenced", True, "fenced"),
    # What the guards cost with the protocol off: the plan still has them.
    Mode("off", "latched parent, scan_mode off", True, "off"),
]


def partitions(workload):
    return int(workload.removeprefix("ptail"))


def reset(conn, workload, mode, schema):
    """A fresh `schema.events` with the workload's partitions and ROWS rows,
    vacuumed and checkpointed."""
    n = partitions(workload)
    table = f"{schema}.events"
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"""CREATE TABLE {table} (id bigserial, created_at timestamptz NOT NULL, payload text NOT NULL,
                     PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)""")
    # Row i is created at minute i; partition p holds an equal share.
    step = -(-ROWS // n)
    for p in range(n):
        lo = "(MINVALUE)" if p == 0 else f"('2020-01-01'::timestamptz + interval '{p * step} minutes')"
        hi = "(MAXVALUE)" if p == n - 1 else f"('2020-01-01'::timestamptz + interval '{(p + 1) * step} minutes')"
        conn.execute(f"CREATE TABLE {table}_{p} PARTITION OF {table} FOR VALUES FROM {lo} TO {hi}")
    if mode.latched:
        conn.execute("SELECT pgkvx.enable(%s::regclass, gapless => true)", (table,))
    conn.execute(f"""INSERT INTO {table} (created_at, payload)
                     SELECT '2020-01-01'::timestamptz + g * interval '1 minute', 'event ' || g
                       FROM generate_series(1, {ROWS}) g""")
    conn.execute(f"VACUUM (ANALYZE) {table}")
    conn.execute("CHECKPOINT")
