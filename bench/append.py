"""The append workload: single-row inserts into `events`, each drawing its
key from the table's DEFAULT, the producer side of a tail table.

The two modes differ only in how a key is drawn: `plain` leaves `events`
unregistered with its bigserial DEFAULT (nextval); `gapless` registers it
with `pgkvx.enable('events', gapless => true)`, which latches every write
and sets the DEFAULT to `pgkvx.next_key(...)`, the draw that publishes the
key's latch before any later key can be drawn.  Paired side by side
(`bench/run --paired --pairs append:gapless`) their throughput ratio is what
gapless keys cost a producer.
"""
from dataclasses import dataclass

WORKLOAD = "append"
DESCRIPTION = "single-row inserts, key from the table's DEFAULT"


@dataclass(frozen=True)
class Mode:
    name: str
    label: str
    gapless: bool       # registered with gapless => true: DEFAULT pgkvx.next_key
    scan_mode: str = "off"   # the workload reads nothing


MODES = [
    Mode("plain", "plain PG (nextval default)", False),
    Mode("gapless", "gapless (pgkvx.next_key default)", True),
]


def reset_events(conn, mode, schema):
    """A fresh, empty `schema.events` for the mode, vacuumed and
    checkpointed so that no round pays for the previous one's garbage."""
    table = f"{schema}.events"
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, payload text NOT NULL)")
    if mode.gapless:
        conn.execute("SELECT pgkvx.enable(%s::regclass, gapless => true)", (table,))
    default = key_default(conn, table)
    # A side whose inserts draw keys the other way would measure nothing.
    if ("next_key" in default) != mode.gapless:
        raise RuntimeError(f"{table}: mode {mode.name} but the key defaults to {default}")
    conn.execute(f"VACUUM (ANALYZE) {table}")
    conn.execute("CHECKPOINT")


def key_default(conn, table):
    """The DEFAULT expression of `table`'s id column."""
    return conn.execute("""SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
        JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
        WHERE d.adrelid = %s::regclass AND a.attname = 'id'""", (table,)).fetchone()[0]
