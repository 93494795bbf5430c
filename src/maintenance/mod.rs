//! The maintenance workers: background processes that keep the latch table
//! partitioned into small, uncontended ranges and free of expired
//! tombstones (the queue and the policy are pure Rust in latch/queue.rs).
//!
//! `pgkvx.maintenance_concurrency` workers start with the server (none when
//! it is 0), without a database connection: they only touch shared memory.
//! Each wakes every few milliseconds (or when a writer enqueues a range),
//! refreshes the xmin horizon, queues what needs attention, and processes
//! queued ranges one at a time, highest priority first.

pub mod worker;
