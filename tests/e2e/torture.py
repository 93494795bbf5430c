"""A randomized, seeded torture test of the tail guarantee, with an oracle.

Writers of many kinds append to, move within and delete from a gapless
`events` table (and write to an `orders` table the readers' filters read)
and append to a gapless identity-keyed `ident_events` table (its identity
default drawn through several statement shapes: VALUES, INSERT ...
SELECT, a generic plan, PL/pgSQL),
roll back whole transactions, savepoints and PL/pgSQL exception blocks,
load in bulk, and disable the table or drop it inside savepoints they roll
back.  Beside them the application's other reads (newest first, `max(id)`,
a count beside a max, the newest rows joined) must never fail.  Consumers
of many kinds tail the table by key — plainly, by category
through a (category, id) index, through a filter subquery, through a
semi-join, with generic plans prepared under every scan mode, with cursors,
under REPEATABLE READ and SERIALIZABLE, and through arrow_scan — each
moving its cursor to the last key it got.  A second gapless table,
`pevents`, is partitioned by category (LIST, two partitions, primary key
(id, category)): writers insert into it and move rows between its
partitions (keeping the key, or drawing a new one), and its consumers tail
the parent, by category, and through arrow_scan.  A watermark writer keeps
`watermark.hw` at the greatest `ident_events` id it sees committed; its
consumers read the watermark beside the stream, in one statement and in one
REPEATABLE READ transaction.  A fenced consumer reads its cursor from an
offsets table through a CTE, beside a materialized CTE over `orders`, which
the writers update.

The oracle: every row committed and never deleted or moved must be
delivered to every consumer whose predicate it matches, once, in key order;
no consumer ever gets a row that never committed; a watermark never shows
without the row it names (ident_events only grows); no statement sees a row
of the materialized CTE twice.  REPEATABLE READ and
SERIALIZABLE consumers may fail with 40001 (they retry from the same
cursor); anyone may meet a deadlock (40P01, retried).

Every decision comes from a seeded generator per thread, so a seed names a
schedule; the interleaving itself is the machine's.  `run()` returns a
report of what was checked; `tests/e2e/test_torture.py` runs a bounded round
in `make test`, `bench/torture` runs long ones.
"""
import random
import threading
import time
from dataclasses import dataclass, field

import psycopg
import pyarrow

CATEGORIES = ["c0", "c1", "c2", "c3"]
SUBSCRIBED = {"c1", "c3"}

SETUP = """
DROP TABLE IF EXISTS events, orders, subscriptions, pevents, ident_events, watermark, consumer_offsets, head_events;
DROP FUNCTION IF EXISTS ident_insert(text);
CREATE TABLE orders (id bigint PRIMARY KEY, paid boolean NOT NULL, note text);
CREATE TABLE events (id bigserial PRIMARY KEY, category text COLLATE "C" NOT NULL,
                     order_id bigint NOT NULL, payload text);
CREATE INDEX events_category_id ON events (category, id);
SELECT pgkvx.enable('events', gapless => true);
CREATE TABLE pevents (id bigserial, category text COLLATE "C" NOT NULL, payload text,
                      PRIMARY KEY (id, category)) PARTITION BY LIST (category);
CREATE TABLE pevents_01 PARTITION OF pevents FOR VALUES IN ('c0', 'c1');
CREATE TABLE pevents_23 PARTITION OF pevents FOR VALUES IN ('c2', 'c3');
CREATE INDEX pevents_category_id ON pevents (category, id);
SELECT pgkvx.enable('pevents', gapless => true);
CREATE TABLE subscriptions (category text COLLATE "C" PRIMARY KEY);
INSERT INTO subscriptions VALUES ('c1'), ('c3');
CREATE TABLE ident_events (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, category text COLLATE "C" NOT NULL);
SELECT pgkvx.enable('ident_events', gapless => true);
CREATE FUNCTION ident_insert(cat text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE k bigint;
BEGIN INSERT INTO ident_events (category) VALUES (cat) RETURNING id INTO k; RETURN k; END $$;
CREATE TABLE head_events (id bigserial PRIMARY KEY, category text COLLATE "C" NOT NULL DEFAULT 'c0');
SELECT pgkvx.enable('head_events', gapless => true);
CREATE TABLE watermark (k int PRIMARY KEY, hw bigint);
INSERT INTO watermark VALUES (1, NULL);
CREATE TABLE consumer_offsets (name text PRIMARY KEY, cur bigint NOT NULL);
INSERT INTO consumer_offsets VALUES ('cte', 0), ('cte join', 0), ('go FOR UPDATE', 0), ('go', 0);
-- statistics that make the planner pick the index plans a tail uses
INSERT INTO orders SELECT g, true, NULL FROM generate_series(-5000, -1) g;
ANALYZE orders, subscriptions;
"""

# Errors a consumer or writer may meet and retry: serialization failure,
# deadlock, lock timeout (a disable waits behind readers).
RETRYABLE = {"40001", "40P01", "55P03"}


@dataclass
class Ledger:
    """What committed: the oracle's view of the table."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    rows: dict = field(default_factory=dict)      # id -> category, committed and alive
    gone: set = field(default_factory=set)        # ids committed, then deleted or moved
    seen_ids: set = field(default_factory=set)    # every id ever committed
    order_seq: int = 0

    def next_order(self):
        with self.lock:
            self.order_seq += 1
            return self.order_seq

    def commit(self, added, removed):
        with self.lock:
            for i, cat in added:
                self.rows[i] = cat
                self.seen_ids.add(i)
            for i in removed:
                self.rows.pop(i, None)
                self.gone.add(i)

    def sample(self, rng):
        with self.lock:
            if not self.rows:
                return None
            # Rows near the tail, where readers are.
            keys = sorted(self.rows)[-200:]
            return rng.choice(keys)


@dataclass
class Report:
    seed: int = 0
    writer_txns: int = 0
    writer_rollbacks: int = 0
    writer_retries: int = 0
    writer_kinds: dict = field(default_factory=dict)
    polls: int = 0
    consumer_retries: int = 0
    neighbour_reads: int = 0
    consumers: dict = field(default_factory=dict)   # name -> delivered count
    committed_rows: int = 0
    stats: dict = field(default_factory=dict)       # pgkvx.stats() deltas
    skipped: dict = field(default_factory=dict)     # name -> [ids]
    phantoms: dict = field(default_factory=dict)    # name -> [ids]
    disorder: list = field(default_factory=list)
    # States no serial order produces: a watermark without its row, a row
    # of one scan seen twice.
    inconsistent: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    # Reads of head_events that waited: its one producer commits in key
    # order, so a writer in flight there is always past every committed
    # row, outside every read's touched span.
    head_read_waits: int = 0

    def ok(self):
        return not (any(self.skipped.values()) or any(self.phantoms.values()) or self.disorder
                    or self.inconsistent or self.errors or self.head_read_waits)

    def summary(self):
        s = self.stats
        return (f"seed {self.seed}: {self.writer_txns} writer transactions "
                f"({self.writer_rollbacks} rolled back, {self.writer_retries} retried), "
                f"{self.committed_rows} rows committed, {self.polls} consumer polls over "
                f"{len(self.consumers)} consumers ({self.consumer_retries} retried), "
                f"{self.neighbour_reads} neighbour reads; "
                f"protocol: {s.get('validations', 0)} validations, {s.get('conflicts', 0)} conflicts, "
                f"{s.get('retries', 0)} retries, {s.get('fallbacks_to_fenced', 0)} fallbacks, "
                f"{s.get('serialization_failures', 0)} serialization failures, "
                f"{s.get('fresh_snapshots', 0)} fresh snapshots; writer kinds {self.writer_kinds}")


def _sqlstate(e):
    return getattr(getattr(e, "diag", None), "sqlstate", None)


class Writer:
    """One writer thread: random transactions of random kinds."""

    KINDS = [("insert", 40), ("savepoint", 10), ("exception_block", 6), ("bulk", 4), ("move", 8),
             ("delete", 6), ("orders", 8), ("disable_rolled_back", 2), ("drop_rolled_back", 1),
             ("disable_in_exception_block", 1), ("partitioned", 10), ("partitioned_move", 4),
             ("identity", 12), ("identity_savepoint", 3)]

    # Ways a statement leaves ident_events' key to its identity default.
    IDENTITY_SHAPES = [
        "INSERT INTO ident_events (category) VALUES (%(cat)s) RETURNING id",
        "INSERT INTO ident_events (category) VALUES (%(cat)s), (%(cat)s) RETURNING id",
        "INSERT INTO ident_events (category) SELECT %(cat)s FROM generate_series(1, 3) RETURNING id",
        # A server-side prepared statement, run with a generic plan.
        "PREPARED INSERT INTO ident_events (category) VALUES (%(cat)s), (%(cat)s) RETURNING id",
        "SELECT ident_insert(%(cat)s)",
    ]

    def __init__(self, connect, ledger, report, seed, stop, pledger=None, ident_ledger=None):
        self.connect, self.ledger, self.report = connect, ledger, report
        self.pledger = pledger if pledger is not None else Ledger()
        self.ident_ledger = ident_ledger if ident_ledger is not None else Ledger()
        self.ident_added = []
        self.rng = random.Random(seed)
        self.stop = stop

    def pick(self):
        total = sum(w for _, w in self.KINDS)
        x = self.rng.randrange(total)
        for k, w in self.KINDS:
            if x < w:
                return k
            x -= w
        raise AssertionError

    def insert_event(self, c, added):
        order = self.ledger.next_order()
        cat = self.rng.choice(CATEGORIES)
        c.execute("INSERT INTO orders VALUES (%s, true, NULL)", (order,))
        (i,) = c.execute("INSERT INTO events (category, order_id, payload) VALUES (%s, %s, 'w') RETURNING id",
                         (cat, order)).fetchone()
        added.append((i, cat))

    def insert_identity(self, c, added):
        cat = self.rng.choice(CATEGORIES)
        shape = self.rng.choice(self.IDENTITY_SHAPES)
        prepared = shape.startswith("PREPARED ")
        rows = c.execute(shape.removeprefix("PREPARED "), {"cat": cat}, prepare=prepared).fetchall()
        added += [(i, cat) for (i,) in rows]

    def pause(self):
        time.sleep(self.rng.random() * 0.004)

    def txn(self, c, kind):
        added, removed = [], []
        self.ident_added = []
        rollback = False
        if kind == "partitioned":
            padded = []
            for _ in range(self.rng.randint(1, 3)):
                cat = self.rng.choice(CATEGORIES)
                (i,) = c.execute("INSERT INTO pevents (category, payload) VALUES (%s, 'w') RETURNING id",
                                 (cat,)).fetchone()
                padded.append((i, cat))
                self.pause()
            if self.rng.random() < 0.1:
                return [], [], True
            self.pending_partitioned = (padded, [])
        elif kind == "partitioned_move":
            # A row moved to another partition: with its key (no longer
            # expected anywhere: consumers past it need not see it again),
            # or with a new key drawn, which every consumer must get.
            victim = self.pledger.sample(self.rng)
            if victim is not None:
                cat = self.rng.choice(CATEGORIES)
                if self.rng.random() < 0.5:
                    r = c.execute("UPDATE pevents SET category = %s WHERE id = %s RETURNING id",
                                  (cat, victim)).fetchone()
                    self.pending_partitioned = ([], [victim] if r else [])
                else:
                    r = c.execute("UPDATE pevents SET id = pgkvx.next_key('pevents'), category = %s "
                                  "WHERE id = %s RETURNING id, category", (cat, victim)).fetchone()
                    self.pending_partitioned = ([(r[0], r[1])] if r else [], [victim] if r else [])
            self.pause()
        elif kind == "identity":
            for _ in range(self.rng.randint(1, 3)):
                self.insert_identity(c, self.ident_added)
                self.pause()
            rollback = self.rng.random() < 0.1
        elif kind == "identity_savepoint":
            self.insert_identity(c, self.ident_added)
            c.execute("SAVEPOINT s")
            self.insert_identity(c, [])
            self.pause()
            c.execute("ROLLBACK TO SAVEPOINT s")
            self.insert_identity(c, self.ident_added)
        elif kind == "insert":
            for _ in range(self.rng.randint(1, 3)):
                self.insert_event(c, added)
                self.pause()
            rollback = self.rng.random() < 0.1
        elif kind == "savepoint":
            self.insert_event(c, added)
            c.execute("SAVEPOINT s")
            lost = []
            self.insert_event(c, lost)
            self.pause()
            c.execute("ROLLBACK TO SAVEPOINT s")
            self.insert_event(c, added)
        elif kind == "exception_block":
            self.insert_event(c, added)
            c.execute("""DO $$ BEGIN
                INSERT INTO events (category, order_id, payload) VALUES ('c0', -1, 'lost');
                RAISE EXCEPTION 'rolled back';
              EXCEPTION WHEN raise_exception THEN NULL; END $$""")
            self.pause()
        elif kind == "bulk":
            n = self.rng.randint(20, 200)
            cat = self.rng.choice(CATEGORIES)
            rows = c.execute("INSERT INTO events (category, order_id, payload) "
                             "SELECT %s, -1 - (g %% 5000), 'bulk' FROM generate_series(1, %s) g RETURNING id",
                             (cat, n)).fetchall()
            added += [(i, cat) for (i,) in rows]
        elif kind == "move":
            victim = self.ledger.sample(self.rng)
            if victim is not None:
                r = c.execute("UPDATE events SET id = pgkvx.next_key('events') WHERE id = %s "
                              "RETURNING id, category", (victim,)).fetchone()
                if r:
                    removed.append(victim)
                    added.append((r[0], r[1]))
            self.pause()
        elif kind == "delete":
            victim = self.ledger.sample(self.rng)
            if victim is not None and c.execute("DELETE FROM events WHERE id = %s", (victim,)).rowcount:
                removed.append(victim)
        elif kind == "orders":
            c.execute("UPDATE orders SET note = md5(random()::text) WHERE id = (SELECT max(id) FROM orders)")
        elif kind == "disable_rolled_back":
            c.execute("SET LOCAL lock_timeout = '200ms'")
            c.execute("SAVEPOINT s")
            c.execute("SELECT pgkvx.disable('events')")
            c.execute("ROLLBACK TO SAVEPOINT s")
        elif kind == "drop_rolled_back":
            c.execute("SET LOCAL lock_timeout = '200ms'")
            c.execute("SAVEPOINT s")
            c.execute("DROP TABLE events")
            c.execute("ROLLBACK TO SAVEPOINT s")
        elif kind == "disable_in_exception_block":
            c.execute("SET LOCAL lock_timeout = '200ms'")
            c.execute("""DO $$ BEGIN
                PERFORM pgkvx.disable('events');
                RAISE EXCEPTION 'rolled back';
              EXCEPTION WHEN raise_exception THEN NULL; END $$""")
        return added, removed, rollback

    def __call__(self):
        try:
            with self.connect(autocommit=False) as c:
                c.execute("SET plan_cache_mode = force_generic_plan")
                c.commit()
                while not self.stop.is_set():
                    kind = self.pick()
                    try:
                        self.pending_partitioned = None
                        added, removed, rollback = self.txn(c, kind)
                        if rollback:
                            c.rollback()
                            self.report.writer_rollbacks += 1
                        else:
                            c.commit()
                            self.ledger.commit(added, removed)
                            if self.pending_partitioned is not None:
                                self.pledger.commit(*self.pending_partitioned)
                            self.ident_ledger.commit(self.ident_added, [])
                        self.report.writer_txns += 1
                        self.report.writer_kinds[kind] = self.report.writer_kinds.get(kind, 0) + 1
                    except psycopg.Error as e:
                        c.rollback()
                        if _sqlstate(e) not in RETRYABLE:
                            raise
                        self.report.writer_retries += 1
        except Exception as e:  # noqa: BLE001 - reported, checked by the caller
            self.report.errors.append(f"writer: {e!r}")


def head_writer(connect, ledger, report, stop):
    """The one producer of head_events: one row per transaction, its key
    held a moment before the commit, so a writer is nearly always in
    flight there -- always past every committed row."""
    try:
        with connect(autocommit=False) as c:
            while not stop.is_set():
                (i,) = c.execute("INSERT INTO head_events DEFAULT VALUES RETURNING id").fetchone()
                time.sleep(0.002)
                c.commit()
                ledger.commit([(i, "c0")], [])
    except Exception as e:  # noqa: BLE001 - reported, checked by the caller
        report.errors.append(f"head writer: {e!r}")


NEIGHBOUR_READS = [
    "SELECT id, category FROM events ORDER BY id DESC LIMIT 20",
    "SELECT max(id) FROM events",
    "SELECT count(*) FROM events WHERE id > (SELECT max(id) - 50 FROM events)",
    "SELECT e.id, o.paid FROM events e JOIN orders o ON o.id = e.order_id ORDER BY e.id DESC LIMIT 20",
]


def neighbour_reader(connect, report, seed, stop):
    """The application's other reads of the busy table: newest first,
    `max(id)`, a count beside a max, the newest rows joined.  They are no
    tails: every error of theirs is one, and the newest-first rows come in
    key order."""
    rng = random.Random(seed)
    try:
        with connect() as c:
            c.execute(f"SET pgkvx.scan_mode = {rng.choice(['optimistic', 'fenced'])}")
            while not stop.is_set():
                sql = rng.choice(NEIGHBOUR_READS)
                try:
                    rows = c.execute(sql).fetchall()
                except psycopg.Error as e:
                    report.errors.append(f"neighbour read {sql!r}: {_sqlstate(e)} {e}")
                    return
                report.neighbour_reads += 1
                if "DESC" in sql and [r[0] for r in rows] != sorted((r[0] for r in rows), reverse=True):
                    report.disorder.append(("neighbour read", sql))
                time.sleep(0.002)
    except Exception as e:  # noqa: BLE001 - reported, checked by the caller
        report.errors.append(f"neighbour reader: {e!r}")


def _read_waits(connect, table):
    with connect() as c:
        return dict(c.execute("SELECT stat, value FROM pgkvx.stats(%s::regclass)", (table,)).fetchall())["read_waits"]


def watermark_writer(connect, report, stop):
    """Sets the watermark to the greatest ident_events id it sees committed,
    again and again: a consumer trusting it must see that row too."""
    try:
        with connect() as c:
            while not stop.is_set():
                try:
                    # A read beside another table cannot stop short of a
                    # writer: under constant writes it may fail, and retries.
                    c.execute("UPDATE watermark SET hw = (SELECT max(id) FROM ident_events)")
                except psycopg.Error as e:
                    if _sqlstate(e) not in RETRYABLE:
                        raise
                    report.writer_retries += 1
                time.sleep(0.002)
    except Exception as e:  # noqa: BLE001 - reported, checked by the caller
        report.errors.append(f"watermark writer: {e!r}")


class Consumer:
    """One consumer thread: polls the tail, moves its cursor, never looks back.
    With `reconnect` (a consumer on a hot standby, where recovery conflicts
    cancel queries and end sessions, as PostgreSQL does), it reconnects and
    polls on from its cursor."""

    def __init__(self, name, connect, report, seed, stop, drained, setup, poll, matches, iso=None, table="events",
                 reconnect=False):
        self.name, self.connect, self.report = name, connect, report
        self.table = table
        self.rng = random.Random(seed)
        self.stop, self.drained = stop, drained
        self.setup, self.poll, self.matches, self.iso = setup, poll, matches, iso
        self.reconnect = reconnect
        self.delivered = []
        self.cursor, self.quiet = 0, 0

    def __call__(self):
        try:
            while not self._session():
                self.report.consumer_retries += 1
        except Exception as e:  # noqa: BLE001 - reported, checked by the caller
            self.report.errors.append(f"{self.name}: {e!r}")

    def _connect(self):
        """A connection; on a standby, a session ended by a recovery
        conflict while it starts (it reads the catalogs) is tried again."""
        for attempt in range(50):
            try:
                return self.connect(autocommit=self.iso is None)
            except psycopg.OperationalError as e:
                if not self.reconnect or "conflict with recovery" not in str(e) or attempt == 49:
                    raise
                self.report.consumer_retries += 1
                time.sleep(0.01)

    def _session(self):
        """Polls on one connection until drained (True), or until it is
        lost when the consumer reconnects (False)."""
        with self._connect() as c:
            try:
                for s in self.setup:
                    c.execute(s)
                if self.iso is not None:
                    c.commit()
            except psycopg.OperationalError:
                if self.reconnect and (c.broken or c.closed):
                    return False
                raise
            while True:
                try:
                    if self.iso is not None:
                        c.execute(f"SET TRANSACTION ISOLATION LEVEL {self.iso}")
                    ids = self.poll(c, self.cursor, self.rng.randint(1, 20))
                    if self.iso is not None:
                        c.commit()
                except psycopg.Error as e:
                    if self.reconnect and (c.broken or c.closed):
                        return False
                    if not c.autocommit:
                        c.rollback()
                    if _sqlstate(e) not in RETRYABLE:
                        raise
                    self.report.consumer_retries += 1
                    continue
                self.report.polls += 1
                for i in ids:
                    if i <= self.cursor:
                        self.report.disorder.append((self.name, self.cursor, i))
                    self.delivered.append(i)
                    self.cursor = i
                if ids:
                    self.quiet = 0
                    continue
                if self.drained.is_set():
                    self.quiet += 1
                    if self.quiet > 30:
                        return True
                time.sleep(0.001)


def _ids(rows):
    return [r[0] for r in rows]


def consumers(connect, report, seed, stop, drained, standby=None):
    """Every consumer kind, with its predicate; with `standby` (connects to
    a hot standby of the primary), tails there too."""
    every = lambda cat: True  # noqa: E731
    out = []

    def add(name, setup, poll, matches=every, iso=None, table="events", on=connect):
        out.append(Consumer(name, on, report, seed * 1000 + len(out), stop, drained, setup, poll, matches, iso,
                            table, reconnect=on is not connect))

    if standby is not None:
        for mode in ("optimistic", "fenced"):
            add(f"standby tail/{mode}", [f"SET pgkvx.scan_mode = {mode}"],
                lambda c, cur, n: _ids(c.execute("SELECT id FROM events WHERE id > %s ORDER BY id LIMIT %s",
                                                 (cur, n)).fetchall()), on=standby)
        add("standby category c2", ["SET pgkvx.scan_mode = optimistic"],
            lambda c, cur, n: _ids(c.execute(
                "SELECT id FROM events WHERE category = 'c2' AND id > %s ORDER BY id LIMIT %s",
                (cur, n)).fetchall()),
            lambda x: x == "c2", on=standby)
        add("standby repeatable read", ["SET pgkvx.scan_mode = optimistic"],
            lambda c, cur, n: _ids(c.execute("SELECT id FROM events WHERE id > %s ORDER BY id LIMIT %s",
                                             (cur, n)).fetchall()), iso="REPEATABLE READ", on=standby)

    for mode in ("optimistic", "fenced"):
        add(f"tail/{mode}", [f"SET pgkvx.scan_mode = {mode}"],
            lambda c, cur, n: _ids(c.execute("SELECT id FROM events WHERE id > %s ORDER BY id LIMIT %s",
                                             (cur, n)).fetchall()))
    for cat in ("c0", "c2"):
        add(f"category {cat}", ["SET pgkvx.scan_mode = optimistic"],
            lambda c, cur, n, cat=cat: _ids(c.execute(
                "SELECT id FROM events WHERE category = %s AND id > %s ORDER BY id LIMIT %s",
                (cat, cur, n)).fetchall()),
            lambda x, cat=cat: x == cat)
    add("filter subquery", ["SET pgkvx.scan_mode = optimistic"],
        lambda c, cur, n: _ids(c.execute(
            "SELECT id FROM events e WHERE id > %s "
            "AND (SELECT paid FROM orders o WHERE o.id = e.order_id) "
            "ORDER BY id LIMIT %s", (cur, n)).fetchall()))
    add("semi-join", ["SET pgkvx.scan_mode = optimistic"],
        lambda c, cur, n: _ids(c.execute(
            "SELECT id FROM events WHERE id > %s AND category IN (SELECT category FROM subscriptions) "
            "ORDER BY id LIMIT %s", (cur, n)).fetchall()),
        lambda x: x in SUBSCRIBED)
    for made, run in (("off", "optimistic"), ("fenced", "optimistic"), ("optimistic", "fenced")):
        add(f"generic plan made {made}, run {run}",
            ["SET plan_cache_mode = force_generic_plan", f"SET pgkvx.scan_mode = {made}",
             "PREPARE tail_q(bigint, int) AS SELECT id FROM events WHERE id > $1 ORDER BY id LIMIT $2",
             "EXECUTE tail_q(0, 1)", f"SET pgkvx.scan_mode = {run}"],
            lambda c, cur, n: _ids(c.execute(f"EXECUTE tail_q({int(cur)}, {int(n)})").fetchall()))

    def cursor_poll(c, cur, n):
        with c.transaction():
            c.execute("DECLARE tc CURSOR FOR SELECT id FROM events WHERE id > %s ORDER BY id LIMIT %s",
                      (cur, n * 3))
            got = []
            while True:
                rows = c.execute("FETCH 4 FROM tc").fetchall()
                got += _ids(rows)
                if len(rows) < 4:
                    return got
    add("cursor", ["SET pgkvx.scan_mode = optimistic"], cursor_poll)
    for iso in ("REPEATABLE READ", "SERIALIZABLE"):
        add(f"tail {iso.lower()}", ["SET pgkvx.scan_mode = optimistic"],
            lambda c, cur, n: _ids(c.execute("SELECT id FROM events WHERE id > %s ORDER BY id LIMIT %s",
                                             (cur, n)).fetchall()),
            iso=iso)

    def arrow_poll(c, cur, n):
        cur_ = c.cursor(binary=True)
        stream = b"".join(r[0] for r in cur_.execute(
            "SELECT pgkvx.arrow_scan('events', '{id}', lower => %s, max_rows => %s)",
            (str(cur + 1), n)).fetchall())
        return pyarrow.ipc.open_stream(stream).read_all().column("id").to_pylist()
    add("arrow_scan", ["SET pgkvx.scan_mode = optimistic"], arrow_poll)

    # The partitioned table: a MergeAppend over its partitions' scans.
    for mode in ("optimistic", "fenced"):
        add(f"partitioned tail/{mode}", [f"SET pgkvx.scan_mode = {mode}"],
            lambda c, cur, n: _ids(c.execute("SELECT id FROM pevents WHERE id > %s ORDER BY id LIMIT %s",
                                             (cur, n)).fetchall()), table="pevents")
    add("partitioned category c1", ["SET pgkvx.scan_mode = optimistic"],
        lambda c, cur, n: _ids(c.execute(
            "SELECT id FROM pevents WHERE category = 'c1' AND id > %s ORDER BY id LIMIT %s", (cur, n)).fetchall()),
        lambda x: x == "c1", table="pevents")

    def parrow_poll(c, cur, n):
        cur_ = c.cursor(binary=True)
        stream = b"".join(r[0] for r in cur_.execute(
            "SELECT pgkvx.arrow_scan('pevents', '{id}', lower => %s, max_rows => %s)",
            (str(cur + 1), n)).fetchall())
        return pyarrow.ipc.open_stream(stream).read_all().column("id").to_pylist()
    add("partitioned arrow_scan", ["SET pgkvx.scan_mode = optimistic"], parrow_poll, table="pevents")
    def watermark_poll(c, cur, n):
        hw, present, ids = c.execute(
            "SELECT w.hw, (SELECT count(*) FROM ident_events WHERE id = w.hw), "
            "array(SELECT id FROM ident_events WHERE id > %s ORDER BY id LIMIT %s) FROM watermark w",
            (cur, n)).fetchone()
        if hw is not None and present != 1:
            report.inconsistent.append(("watermark", hw, cur, ids))
        return ids or []

    def watermark_rr_poll(c, cur, n):
        ids = _ids(c.execute("SELECT id FROM ident_events WHERE id > %s ORDER BY id LIMIT %s", (cur, n)).fetchall())
        hw, present = c.execute("SELECT w.hw, (SELECT count(*) FROM ident_events WHERE id = w.hw) "
                                "FROM watermark w").fetchone()
        if hw is not None and present != 1:
            report.inconsistent.append(("watermark repeatable read", hw, cur, ids))
        return ids

    for mode in ("optimistic", "fenced"):
        add(f"watermark/{mode}", [f"SET pgkvx.scan_mode = {mode}"], watermark_poll, table="ident_events")
    add("watermark repeatable read", ["SET pgkvx.scan_mode = optimistic"], watermark_rr_poll,
        iso="REPEATABLE READ", table="ident_events")

    def cte_poll(c, cur, n):
        c.execute("UPDATE consumer_offsets SET cur = %s WHERE name = 'cte'", (cur,))
        rows = c.execute(
            "WITH o AS (SELECT cur FROM consumer_offsets WHERE name = 'cte' FOR UPDATE), "
            "     m AS MATERIALIZED (SELECT id, random() AS r FROM orders) "
            "SELECT e.id, (SELECT count(*) FROM m), (SELECT count(DISTINCT id) FROM m) "
            "FROM events e WHERE e.id > (SELECT cur FROM o) ORDER BY e.id LIMIT %s", (n,)).fetchall()
        for _, total, distinct in rows:
            if total != distinct:
                report.inconsistent.append(("materialized CTE", total, distinct))
        return _ids(rows)
    add("cursor from a CTE, fenced at the scan", ["SET pgkvx.scan_mode = fenced"], cte_poll)

    def cte_join_poll(c, cur, n):
        # The cursor joined from the CTE, not read by a subquery: bounded
        # all the same (scan/cte_bound.rs).
        c.execute("UPDATE consumer_offsets SET cur = %s WHERE name = 'cte join'", (cur,))
        return _ids(c.execute(
            "WITH o AS (SELECT cur FROM consumer_offsets WHERE name = 'cte join' FOR UPDATE) "
            "SELECT e.id FROM events e, o WHERE e.id > o.cur ORDER BY e.id LIMIT %s", (n,)).fetchall())
    add("cursor joined from a CTE", ["SET pgkvx.scan_mode = optimistic"], cte_join_poll)

    # At the head of head_events, whatever the shape, no read ever waits
    # (Report.head_read_waits).
    add("head tail", ["SET pgkvx.scan_mode = optimistic"],
        lambda c, cur, n: _ids(c.execute("SELECT id FROM head_events WHERE id > %s ORDER BY id LIMIT %s",
                                         (cur, n)).fetchall()), table="head_events")
    add("head through a sort", ["SET pgkvx.scan_mode = optimistic", "SET enable_indexscan = off"],
        lambda c, cur, n: _ids(c.execute("SELECT id FROM head_events WHERE id > %s ORDER BY id LIMIT %s",
                                         (cur, n)).fetchall()), table="head_events")
    # (A list of the next ids would be read whole: its writer in flight is
    # waited for, rightly.)
    add("head OR", ["SET pgkvx.scan_mode = optimistic"],
        lambda c, cur, n: _ids(c.execute(
            "SELECT id FROM head_events WHERE (id > %(c)s AND id <= %(c)s + 2) OR id > %(c)s + 2 "
            "ORDER BY id LIMIT %(n)s", {"c": cur, "n": n}).fetchall()), table="head_events")

    # Declared spans that are sets: an OR of a window, a list and the rest
    # of the tail (a BitmapOr under a Sort); `= ANY` or the rest, in a
    # generic plan.
    add("OR of a range, a list and the tail", ["SET pgkvx.scan_mode = optimistic"],
        lambda c, cur, n: _ids(c.execute(
            # Values as the key's type: psycopg sends a small int as a
            # smallint, and `cursor + n` must not overflow one once a long
            # run's ids pass 32767.
            "SELECT id FROM events WHERE (id > %(c)s::bigint AND id <= %(c)s::bigint + %(n)s) "
            "OR id = ANY(%(l)s::bigint[]) OR id > %(c)s::bigint + 2 * %(n)s ORDER BY id LIMIT %(n)s",
            {"c": cur, "n": n, "l": list(range(cur + n + 1, cur + 2 * n + 1))}).fetchall()))
    add("= ANY or the tail, generic plan",
        ["SET plan_cache_mode = force_generic_plan", "SET pgkvx.scan_mode = optimistic",
         "PREPARE any_q(bigint[], bigint, int) AS "
         "SELECT id FROM events WHERE id = ANY($1) OR id > $2 ORDER BY id LIMIT $3"],
        lambda c, cur, n: _ids(c.execute(
            f"EXECUTE any_q('{{{','.join(str(int(cur) + i) for i in range(1, n + 1))}}}', {int(cur) + n}, {int(n)})"
        ).fetchall()))
    # Read in no key order, sorted above: T ends at the greatest key read.
    add("through a sort", ["SET pgkvx.scan_mode = optimistic", "SET enable_indexscan = off"],
        lambda c, cur, n: _ids(c.execute("SELECT id FROM events WHERE id > %s ORDER BY id LIMIT %s",
                                         (cur, n)).fetchall()))

    # A consumer-group library's poll: the cursor from a CTE inside a
    # subquery, under the outer ORDER BY ... LIMIT.
    def go_poll(c, cur, n, name, lock):
        c.execute("UPDATE consumer_offsets SET cur = %s WHERE name = %s", (cur, name))
        return _ids(c.execute(
            f"SELECT id FROM (WITH last AS (SELECT cur FROM consumer_offsets WHERE name = %s {lock}) "
            "SELECT * FROM events WHERE id > (SELECT cur FROM last)) m ORDER BY id LIMIT %s", (name, n)).fetchall())
    for name, lock in (("go FOR UPDATE", "FOR UPDATE"), ("go", "")):
        add(f"cursor from a CTE in a subquery ({name})", ["SET pgkvx.scan_mode = optimistic"],
            lambda c, cur, n, name=name, lock=lock: go_poll(c, cur, n, name, lock))

    for mode in ("optimistic", "fenced"):
        add(f"identity tail/{mode}", [f"SET pgkvx.scan_mode = {mode}"],
            lambda c, cur, n: _ids(c.execute("SELECT id FROM ident_events WHERE id > %s ORDER BY id LIMIT %s",
                                             (cur, n)).fetchall()),
            table="ident_events")
    add("identity category c1", ["SET pgkvx.scan_mode = optimistic"],
        lambda c, cur, n: _ids(c.execute(
            "SELECT id FROM ident_events WHERE id > %s AND category = 'c1' ORDER BY id LIMIT %s",
            (cur, n)).fetchall()),
        lambda x: x == "c1", table="ident_events")
    return out


STAT_KEYS = ("validations", "conflicts", "retries", "fallbacks_to_fenced", "serialization_failures",
             "fresh_snapshots", "latches_escalated")


def _stats(connect):
    with connect() as c:
        return dict(c.execute("SELECT stat, value FROM pgkvx.stats()").fetchall())


def _caught_up(connect, standby):
    """Waits until the standby has replayed all the primary wrote, so that
    its consumers drain what the primary's do.  Bounds a hang only."""
    with connect() as p, standby() as s:
        (lsn,) = p.execute("SELECT pg_current_wal_insert_lsn()").fetchone()
        p.execute("SELECT pg_switch_wal()")
        for _ in range(600):
            if s.execute("SELECT pg_last_wal_replay_lsn() >= %s", (lsn,)).fetchone()[0]:
                return
            time.sleep(0.1)
    raise AssertionError("the standby did not replay the round")


def run(connect, seed, seconds, writers=4, standby=None):
    """One round: `connect(autocommit=True)` opens a connection to a database
    with pgkvx installed; `standby(autocommit=True)`, if given, to the same
    database on a hot standby of it.  Returns a Report."""
    report = Report(seed=seed)
    with connect() as c:
        c.execute(SETUP)
    if standby is not None:
        _caught_up(connect, standby)  # its tables exist there too
    before = _stats(connect)
    ledger, pledger, ident_ledger, head_ledger = Ledger(), Ledger(), Ledger(), Ledger()
    ledgers = {"events": ledger, "pevents": pledger, "ident_events": ident_ledger, "head_events": head_ledger}
    head_waits_before = _read_waits(connect, "head_events")
    stop, drained = threading.Event(), threading.Event()
    ws = [Writer(connect, ledger, report, seed * 100 + i, stop, pledger, ident_ledger) for i in range(writers)]
    cs = consumers(connect, report, seed, stop, drained, standby)
    ws.append(lambda: watermark_writer(connect, report, stop))
    ws.append(lambda: head_writer(connect, head_ledger, report, stop))
    for i in range(2):
        ws.append(lambda i=i: neighbour_reader(connect, report, seed * 100 + 50 + i, stop))
    threads = [threading.Thread(target=w) for w in ws] + [threading.Thread(target=c) for c in cs]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads[:len(ws)]:
        t.join()
    if standby is not None:
        _caught_up(connect, standby)
    drained.set()
    for t in threads[len(ws):]:
        t.join()
    after = _stats(connect)
    report.stats = {k: after.get(k, 0) - before.get(k, 0) for k in STAT_KEYS}
    report.committed_rows = sum(len(led.seen_ids) for led in ledgers.values())
    report.head_read_waits = _read_waits(connect, "head_events") - head_waits_before
    for cons in cs:
        led = ledgers[cons.table]
        got = set(cons.delivered)
        report.consumers[cons.name] = len(cons.delivered)
        if len(got) != len(cons.delivered):
            report.disorder.append((cons.name, "duplicates"))
        expected = {i for i, cat in led.rows.items() if cons.matches(cat)}
        report.skipped[cons.name] = sorted(expected - got)
        report.phantoms[cons.name] = sorted(got - led.seen_ids)
    return report
