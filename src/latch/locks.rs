//! The locks the latch table needs, abstracted so the core stays pure Rust.
//!
//! In Postgres these are LWLocks in named tranches (so waits show up in
//! `pg_stat_activity`); in plain `cargo test` they are parking_lot locks.

/// Which lock.  A Range lock is waited for only under the Directory lock,
/// and only the exclusive Directory holder holds two; a Range lock taken
/// without the Directory lock is only tried, and its holder waits for
/// nothing (so no two processes can wait on each other).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockId {
    /// Tables and their range boundaries.
    Directory,
    /// One latch range: its interval tree, tombstone list and counts.
    Range(u32),
    /// One latched table's key-drawing critical section (`next_key`).
    Table(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

pub trait LockSet {
    fn acquire(&self, id: LockId, mode: Mode);
    /// Acquires without waiting; false when the lock is busy.
    fn try_acquire(&self, id: LockId, mode: Mode) -> bool;
    fn release(&self, id: LockId);
}

/// Releases a lock when dropped, including during unwinding.
pub(crate) struct Held<'a, L: LockSet + ?Sized> {
    locks: &'a L,
    id: LockId,
}

impl<'a, L: LockSet + ?Sized> Held<'a, L> {
    pub(crate) fn new(locks: &'a L, id: LockId, mode: Mode) -> Self {
        locks.acquire(id, mode);
        Held { locks, id }
    }

    /// Takes the lock if it is free right now.
    pub(crate) fn try_new(locks: &'a L, id: LockId, mode: Mode) -> Option<Self> {
        locks.try_acquire(id, mode).then(|| Held { locks, id })
    }

    /// Takes the lock, telling the caller whether it had to wait.
    pub(crate) fn new_counting(locks: &'a L, id: LockId, mode: Mode) -> (Self, bool) {
        match Held::try_new(locks, id, mode) {
            Some(held) => (held, false),
            None => (Held::new(locks, id, mode), true),
        }
    }
}

impl<L: LockSet + ?Sized> Drop for Held<'_, L> {
    fn drop(&mut self) {
        self.locks.release(self.id);
    }
}

/// Process-local locks for tests and benchmarks.
#[cfg(any(test, feature = "std-locks"))]
pub mod std_locks {
    use super::{LockId, LockSet, Mode};
    use parking_lot::lock_api::RawRwLock as _;
    use parking_lot::RawRwLock;

    /// parking_lot's raw unlock must know the mode, so an exclusive holder
    /// marks its lock; shared and exclusive holders never coexist.
    pub struct StdLocks {
        directory: RawRwLock,
        ranges: Vec<RawRwLock>,
        tables: Vec<RawRwLock>,
        modes: Vec<std::sync::atomic::AtomicBool>,
    }

    impl StdLocks {
        pub fn new(ranges: u32, tables: u32) -> Self {
            let n = 1 + ranges as usize + tables as usize;
            StdLocks {
                directory: RawRwLock::INIT,
                ranges: (0..ranges).map(|_| RawRwLock::INIT).collect(),
                tables: (0..tables).map(|_| RawRwLock::INIT).collect(),
                modes: (0..n).map(|_| std::sync::atomic::AtomicBool::new(false)).collect(),
            }
        }

        fn get(&self, id: LockId) -> (&RawRwLock, usize) {
            match id {
                LockId::Directory => (&self.directory, 0),
                LockId::Range(i) => (&self.ranges[i as usize], 1 + i as usize),
                LockId::Table(i) => (&self.tables[i as usize], 1 + self.ranges.len() + i as usize),
            }
        }
    }

    impl LockSet for StdLocks {
        fn acquire(&self, id: LockId, mode: Mode) {
            let (l, slot) = self.get(id);
            match mode {
                Mode::Shared => l.lock_shared(),
                Mode::Exclusive => {
                    l.lock_exclusive();
                    self.modes[slot].store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }

        fn try_acquire(&self, id: LockId, mode: Mode) -> bool {
            let (l, slot) = self.get(id);
            match mode {
                Mode::Shared => l.try_lock_shared(),
                Mode::Exclusive => {
                    let ok = l.try_lock_exclusive();
                    if ok {
                        self.modes[slot].store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    ok
                }
            }
        }

        fn release(&self, id: LockId) {
            let (l, slot) = self.get(id);
            // Only the exclusive holder can have set the flag, and it clears
            // it before unlocking, so a shared holder always reads false (a
            // plain load and store, not a swap: nobody else can write it now).
            let flag = &self.modes[slot];
            if flag.load(std::sync::atomic::Ordering::Relaxed) {
                flag.store(false, std::sync::atomic::Ordering::Relaxed);
                // SAFETY: this thread holds the lock exclusively (flag set by it).
                unsafe { l.unlock_exclusive() }
            } else {
                // SAFETY: this thread holds the lock in shared mode.
                unsafe { l.unlock_shared() }
            }
        }
    }
}

/// A latch table on the heap with process-local locks: for tests and
/// benchmarks outside Postgres.  The memory is leaked on purpose (a table
/// lives as long as the process, as in Postgres).
#[cfg(any(test, feature = "std-locks"))]
pub fn heap_table(cfg: super::Config) -> &'static super::LatchTable<'static, std_locks::StdLocks> {
    use super::LatchTable;
    let size = LatchTable::<std_locks::StdLocks>::region_size(&cfg);
    let mem: &'static mut [u64] = Box::leak(vec![0u64; size.div_ceil(8)].into_boxed_slice());
    let locks = std_locks::StdLocks::new(cfg.max_ranges, cfg.max_tables);
    // SAFETY: a fresh, leaked, 8-byte aligned buffer of the right size.
    let t = unsafe { LatchTable::init(mem.as_mut_ptr() as *mut u8, &cfg, locks) };
    Box::leak(Box::new(t))
}
