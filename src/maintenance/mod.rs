//! The maintenance workers: background processes that keep the latch table
//! partitioned into small, uncontended ranges and free of expired
//! tombstones (the queue and the policy are pure Rust in latch/queue.rs).
//!
//! One launcher starts with the server (none when
//! `pgkvx.maintenance_concurrency` is 0), without a database connection:
//! it only touches shared memory.  It refreshes the xmin horizon, queues
//! what needs attention and processes queued ranges one at a time, highest
//! priority first, starting helpers (at most the concurrency setting in
//! all) while more ranges wait than it takes; they exit once the queue
//! stays empty.  Idle, pgkvx holds one background-worker slot.

pub mod worker;
