//! Draws whose latch is not in WAL yet.  A standby must never replay a
//! drawn key's commit before the latch of a key drawn earlier (README.md,
//! "Standbys").  Logging a drawn key's latch inside the draw section would
//! order that by itself, but it puts a WAL insertion, which can wait, under
//! the section's lock that every producer of the table queues on.  So the
//! drawer takes a ticket inside the section, logs its latch right after it
//! and hands the ticket back; a transaction that drew keys, before its
//! commit record, waits until no ticket older than its own newest one is
//! out.  The window is a few microseconds: such a wait is rare and short.

use super::locks::LockSet;
use super::table::LatchTable;
use std::sync::atomic::Ordering::SeqCst;

impl<L: LockSet> LatchTable<'_, L> {
    /// Inside a draw section, for the backend in `slot` that just published
    /// a drawn key's latch and logs it after the section: its ticket, later
    /// than every ticket taken in a section before.
    pub(crate) fn take_draw_ticket(&self, slot: u32) -> u64 {
        let hdr = &self.mem.region.hdr;
        let t = hdr.draw_ticket.fetch_add(1, SeqCst);
        if self.backend(slot).unlogged_draw.swap(t, SeqCst) == 0 {
            hdr.draw_tickets_out.fetch_add(1, SeqCst);
        }
        t
    }

    /// The backend in `slot` logged its drawn latch (or gave up on it: its
    /// transaction aborts, or the backend exits).
    pub(crate) fn return_draw_ticket(&self, slot: u32) {
        if self.backend(slot).unlogged_draw.swap(0, SeqCst) != 0 {
            self.mem.region.hdr.draw_tickets_out.fetch_sub(1, SeqCst);
        }
    }

    /// Whether a backend other than `slot` holds a ticket older than
    /// `ticket`: a key drawn before one of the caller's whose latch is not
    /// in WAL yet.  Nearly always no ticket is out at all, which one word
    /// says; only then are the backends' slots looked at.
    pub(crate) fn older_draw_unlogged(&self, slot: u32, ticket: u64) -> bool {
        let own = u32::from(self.backend(slot).unlogged_draw.load(SeqCst) != 0);
        if self.mem.region.hdr.draw_tickets_out.load(SeqCst) <= own {
            return false;
        }
        (0..self.mem.region.hdr.cfg.max_backends).any(|s| {
            let t = self.backend(s).unlogged_draw.load(SeqCst);
            s != slot && t != 0 && t < ticket
        })
    }
}
