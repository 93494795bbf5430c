//! The maintenance queue's per-range state, as shown in `pgkvx.ranges`.

/// Not queued.
pub const IDLE: u32 = 0;
/// Waiting for a worker.
pub const QUEUED: u32 = 1;
/// A worker is on it.
pub const PROCESSING: u32 = 2;
/// Re-enqueued while being processed: re-evaluated when the worker is done.
pub const REQUEUED: u32 = PROCESSING | 4;

pub fn state_name(state: u32) -> &'static str {
    match state {
        IDLE => "idle",
        QUEUED => "queued",
        PROCESSING => "processing",
        REQUEUED => "processing, requeued",
        _ => "unknown",
    }
}
