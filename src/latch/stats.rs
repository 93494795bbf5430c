//! Counters, kept per backend slot (no shared cache line to fight over) and
//! summed when read.

/// Every counter `pgkvx.stats()` reports, in its order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Stat {
    LatchesAcquired,
    LatchesReleasedCommit,
    LatchesReleasedAbort,
    LatchTableFull,
    TombstonesReclaimed,
    TombstonesCoalesced,
    RangeSplits,
    RangeMerges,
    RangeLockWaits,
    ScansOff,
    ScansFenced,
    ScansOptimistic,
    Validations,
    Conflicts,
    Retries,
    FreshSnapshots,
    Fallbacks,
    SerializationFailures,
    WaitMicros,
    KeysDrawn,
    LatchesCovered,
    LatchesEscalated,
}

pub const NSTATS: usize = Stat::LatchesEscalated as usize + 1;

impl Stat {
    pub const ALL: [Stat; NSTATS] = [
        Stat::LatchesAcquired,
        Stat::LatchesReleasedCommit,
        Stat::LatchesReleasedAbort,
        Stat::LatchTableFull,
        Stat::TombstonesReclaimed,
        Stat::TombstonesCoalesced,
        Stat::RangeSplits,
        Stat::RangeMerges,
        Stat::RangeLockWaits,
        Stat::ScansOff,
        Stat::ScansFenced,
        Stat::ScansOptimistic,
        Stat::Validations,
        Stat::Conflicts,
        Stat::Retries,
        Stat::FreshSnapshots,
        Stat::Fallbacks,
        Stat::SerializationFailures,
        Stat::WaitMicros,
        Stat::KeysDrawn,
        Stat::LatchesCovered,
        Stat::LatchesEscalated,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stat::LatchesAcquired => "latches_acquired",
            Stat::LatchesReleasedCommit => "latches_released_commit",
            Stat::LatchesReleasedAbort => "latches_released_abort",
            Stat::LatchTableFull => "latch_table_full",
            Stat::TombstonesReclaimed => "tombstones_reclaimed",
            Stat::TombstonesCoalesced => "tombstones_coalesced",
            Stat::RangeSplits => "range_splits",
            Stat::RangeMerges => "range_merges",
            Stat::RangeLockWaits => "range_lock_waits",
            Stat::ScansOff => "scans_off",
            Stat::ScansFenced => "scans_fenced",
            Stat::ScansOptimistic => "scans_optimistic",
            Stat::Validations => "validations",
            Stat::Conflicts => "conflicts",
            Stat::Retries => "retries",
            Stat::FreshSnapshots => "fresh_snapshots",
            Stat::Fallbacks => "fallbacks_to_fenced",
            Stat::SerializationFailures => "serialization_failures",
            Stat::WaitMicros => "wait_us",
            Stat::KeysDrawn => "keys_drawn",
            Stat::LatchesCovered => "latches_covered",
            Stat::LatchesEscalated => "latches_escalated",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_counter_once_in_order() {
        for (i, s) in Stat::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
        }
        let mut names: Vec<_> = Stat::ALL.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), NSTATS);
    }
}
