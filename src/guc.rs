//! pgkvx's settings, all of them: defined and registered here, read
//! wherever they apply.  Postmaster-level ones size shared memory and can
//! only change with a restart; the rest can be changed per session or
//! reload.  The `pgkvx.` prefix is reserved, so a misspelt setting is an
//! error rather than a silently ignored placeholder.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};
use pgrx::pg_sys;

/// How LIMIT scans over latched tables treat in-flight writers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PostgresGucEnum)]
pub enum ScanMode {
    /// Read at once, validate what was touched, retry only on a real conflict.
    #[name = c"optimistic"]
    Optimistic,
    /// Wait for every in-flight writer of the declared span, then read.
    #[name = c"fenced"]
    Fenced,
    /// Plain Postgres (rows committed late can be skipped).
    #[name = c"off"]
    Off,
}

impl ScanMode {
    pub fn name(self) -> &'static str {
        match self {
            ScanMode::Optimistic => "optimistic",
            ScanMode::Fenced => "fenced",
            ScanMode::Off => "off",
        }
    }
}

pub static SCAN_MODE: GucSetting<ScanMode> = GucSetting::<ScanMode>::new(ScanMode::Optimistic);
pub static OPTIMISTIC_RETRIES: GucSetting<i32> = GucSetting::<i32>::new(2);
pub static MAX_OPTIMISTIC_ROWS: GucSetting<i32> = GucSetting::<i32>::new(10_000);
pub static MAX_LATCHES: GucSetting<i32> = GucSetting::<i32>::new(65_536);
pub static MAX_RANGES: GucSetting<i32> = GucSetting::<i32>::new(1024);
pub static MAX_TABLES: GucSetting<i32> = GucSetting::<i32>::new(256);
pub static MAINTENANCE_CONCURRENCY: GucSetting<i32> = GucSetting::<i32>::new(4);
pub static RANGE_MAX_LATCHES: GucSetting<i32> = GucSetting::<i32>::new(1024);
pub static MAX_LATCHES_PER_TRANSACTION: GucSetting<i32> = GucSetting::<i32>::new(8192);
pub static MAX_LATCHES_PER_ROLE: GucSetting<i32> = GucSetting::<i32>::new(16384);
pub static MAX_TABLES_PER_OWNER: GucSetting<i32> = GucSetting::<i32>::new(64);
pub static UNPROTECTED_READS: GucSetting<Unprotected> = GucSetting::<Unprotected>::new(Unprotected::Warning);

/// What to do with a LIMIT read in key order over a latched table whose
/// writes pgkvx cannot see (a logical replication target, a disabled latch
/// trigger): the read runs, but it can skip a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PostgresGucEnum)]
pub enum Unprotected {
    /// Run the read and say so.
    #[name = c"warning"]
    Warning,
    /// Refuse the read.
    #[name = c"error"]
    Error,
    /// Run the read silently.
    #[name = c"allow"]
    Allow,
}

/// How arrow_scan/arrow_query send numeric columns whose declared precision
/// does not fit Decimal128.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PostgresGucEnum)]
pub enum ArrowNumeric {
    #[name = c"text"]
    Text,
    #[name = c"float64"]
    Float64,
    #[name = c"decimal128"]
    Decimal128,
}

pub static ARROW_NUMERIC: GucSetting<ArrowNumeric> = GucSetting::<ArrowNumeric>::new(ArrowNumeric::Text);
pub static ARROW_NUMERIC_SCALE: GucSetting<i32> = GucSetting::<i32>::new(9);

/// Defines every setting, then reserves the prefix; called from `_PG_init`.
///
/// The groups define their settings in the order they always were: a
/// setting's value from postgresql.conf is checked as it is defined, so
/// the order is the order of any warnings about bad values.
pub fn init() {
    define_read_settings();
    define_capacity();
    define_write_limits();
    define_unprotected_reads_and_splits();
    define_arrow_settings();
    // SAFETY: called in _PG_init after every pgkvx setting is defined; it
    // only drops (with a warning) placeholders under the prefix.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"pgkvx".as_ptr()) };
}

/// How a LIMIT scan over a latched table reads: optimistic, fenced or off,
/// and when optimism gives way to fencing.
fn define_read_settings() {
    GucRegistry::define_enum_guc(
        c"pgkvx.scan_mode",
        c"How LIMIT scans over latched tables treat writers in flight.",
        c"optimistic: read at once and validate the touched span; fenced: wait for writers of the declared span first; off: plain Postgres.",
        &SCAN_MODE,
        GucContext::Userset,
        GucFlags::EXPLAIN,
    );
    GucRegistry::define_int_guc(
        c"pgkvx.optimistic_retries",
        c"Conflicting optimistic attempts before a scan falls back to fenced.",
        c"",
        &OPTIMISTIC_RETRIES,
        0,
        100,
        GucContext::Userset,
        GucFlags::EXPLAIN,
    );
    GucRegistry::define_int_guc(
        c"pgkvx.max_optimistic_rows",
        c"Largest LIMIT+OFFSET an optimistic scan buffers; larger scans go fenced up front.",
        c"",
        &MAX_OPTIMISTIC_ROWS,
        1,
        100_000_000,
        GucContext::Userset,
        GucFlags::EXPLAIN,
    );
}

/// The shared memory and maintenance workers sized at server start: only a
/// restart changes them.
fn define_capacity() {
    GucRegistry::define_int_guc(
        c"pgkvx.max_latches",
        c"Capacity of the shared latch table (live latches plus retained tombstones).",
        c"Each entry takes about 250 bytes of shared memory (the entry and its share of the tree nodes).",
        &MAX_LATCHES,
        64,
        64 * 1024 * 1024,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgkvx.max_ranges",
        c"Latch ranges available across all latched tables.",
        c"Each range takes about 0.9 KB of shared memory (its slot and its tree's root node).",
        &MAX_RANGES,
        8,
        1024 * 1024,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgkvx.max_tables",
        c"Latched tables across all databases.",
        c"",
        &MAX_TABLES,
        1,
        1024 * 1024,
        GucContext::Postmaster,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgkvx.maintenance_concurrency",
        c"Latch ranges the maintenance workers process at once.",
        c"",
        &MAINTENANCE_CONCURRENCY,
        0,
        64,
        GucContext::Postmaster,
        GucFlags::default(),
    );
}

/// Shares of the latch table one transaction, role or table owner may take,
/// so that no tenant can fill it for the others.
fn define_write_limits() {
    GucRegistry::define_int_guc(
        c"pgkvx.max_latches_per_transaction",
        c"Latch entries one transaction may hold.",
        c"Point latches of one table escalate into one span latch after half this many; a transaction still over it after escalating every table gets SQLSTATE 53400.",
        &MAX_LATCHES_PER_TRANSACTION,
        16,
        64 * 1024 * 1024,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgkvx.max_latches_per_role",
        c"Latch entries the transactions of one role may hold together (0: no limit).",
        c"Counted per session user, checked every 64 entries a transaction takes; a transaction over it escalates its latches, then gets SQLSTATE 53400.",
        &MAX_LATCHES_PER_ROLE,
        0,
        i32::MAX,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgkvx.max_tables_per_owner",
        c"Latch-table slots the tables of one owner may take (0: no limit).",
        c"A table takes a slot while it is written (and a few seconds after).",
        &MAX_TABLES_PER_OWNER,
        0,
        1024 * 1024,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

/// What a read does when pgkvx cannot see a table's writes, and when a latch
/// range is split.
fn define_unprotected_reads_and_splits() {
    GucRegistry::define_enum_guc(
        c"pgkvx.unprotected_reads",
        c"What a LIMIT read of a latched table does when pgkvx cannot see that table's writes.",
        c"warning: read and warn; error: refuse; allow: read silently.  Applies to logical replication targets and tables whose latch trigger is not enabled ALWAYS.",
        &UNPROTECTED_READS,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgkvx.range_max_latches",
        c"Latches (and tombstones) a latch range holds before it is split.",
        c"",
        &RANGE_MAX_LATCHES,
        16,
        1024 * 1024,
        GucContext::Sighup,
        GucFlags::default(),
    );
}

/// How arrow_scan and arrow_query encode numeric columns.
fn define_arrow_settings() {
    GucRegistry::define_enum_guc(
        c"pgkvx.arrow_numeric",
        c"How arrow_scan/arrow_query send numeric columns without a precision of at most 38.",
        c"text (default): Utf8, lossless; float64: Float64; decimal128: Decimal128(38, pgkvx.arrow_numeric_scale), rounded like a cast.",
        &ARROW_NUMERIC,
        GucContext::Userset,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"pgkvx.arrow_numeric_scale",
        c"Scale of Decimal128(38, s) when pgkvx.arrow_numeric = decimal128.",
        c"",
        &ARROW_NUMERIC_SCALE,
        0,
        38,
        GucContext::Userset,
        GucFlags::default(),
    );
}
