//! The state of the transaction, as cleanup code must ask it.

/// True while the transaction can still run catalog and buffer-manager code.
/// During abort Postgres releases pins, locks and snapshots through resource
/// owners *before* memory contexts (and with them our Rust state) are freed;
/// cleanup that ran then would release everything a second time.
pub fn in_live_transaction() -> bool {
    // SAFETY: reads backend-local transaction state; callable at any time,
    // cannot raise.
    unsafe { super::raw::IsTransactionState() }
}
