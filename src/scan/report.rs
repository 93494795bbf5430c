//! What the read protocol did for a statement, as its nodes show it to
//! EXPLAIN ANALYZE.

use pgkvx_latch::protocol::ReadReport;

/// How a statement's guarded reads ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadPath {
    /// `pgkvx.scan_mode = off`: plain PostgreSQL.
    #[default]
    Off,
    Fenced,
    /// Fenced when each guarded scan started, on its bounds as they were
    /// then (they came from an init plan or a CTE).
    FencedAtScan,
    /// Optimistic, and its declared spans were clean: it streamed.
    Streamed,
    /// Optimistic, its declared spans met writers, none where its rows
    /// end or behind (the probe): it streamed.
    ProbedStreamed,
    /// Optimistic, its result held back until valid.
    Optimistic,
    /// Optimistic, but its result outgrew what can be held back.
    Overflowed,
    /// Optimistic, then fenced after `pgkvx.optimistic_retries` conflicts.
    FellBack,
}

impl ReadPath {
    /// As EXPLAIN ANALYZE shows it.
    pub fn describe(self) -> &'static str {
        match self {
            ReadPath::Off => "off",
            ReadPath::Fenced => "fenced",
            ReadPath::FencedAtScan => "fenced when the scan started",
            ReadPath::Streamed => "optimistic, declared spans clean: streamed",
            ReadPath::ProbedStreamed => "optimistic, clean up to where its rows end: streamed",
            ReadPath::Optimistic => "optimistic",
            ReadPath::Overflowed => "optimistic, result too large to hold back: fenced",
            ReadPath::FellBack => "optimistic, fell back to fenced",
        }
    }
}

/// What the read protocol did for the node's statement, for EXPLAIN (the
/// statement runs the protocol; its nodes show the outcome).
#[derive(Default, Debug)]
pub struct StatementReport {
    pub mode: ReadPath,
    pub report: ReadReport,
    pub wait_us: i64,
    /// The writers the statement waited for, named by EXPLAIN ANALYZE.
    pub waited: Vec<crate::read::run::Waited>,
}

impl StatementReport {
    /// Adds what one run of the protocol did for the statement.
    pub fn record(&mut self, report: ReadReport, wait_us: i64, waited: Vec<crate::read::run::Waited>) {
        self.report.add(&report);
        self.wait_us += wait_us;
        let room = crate::read::run::MAX_WAITED.saturating_sub(self.waited.len());
        self.waited.extend(waited.into_iter().take(room));
    }
}
