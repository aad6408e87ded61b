//! [`Registration`]: a heartbeat-table slot that unregisters when dropped.

use super::error::HeartbeatError;
use super::table::HeartbeatTable;

/// A worker's registration in a [`HeartbeatTable`]; unregistered when dropped (in-flight
/// bits still set are left for the watchdog, as with
/// [`unregister`](HeartbeatTable::unregister)).
///
/// # Examples
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// use cxc_sync::HeartbeatTable;
/// let table = HeartbeatTable::create(dir.path().join("w.hb"), 8)?;
/// {
///     let me = table.join()?;
///     me.mark_in_flight(3)?;
///     me.beat()?;
///     assert_eq!(me.in_flight(), Some(1 << 3));
///     me.clear_in_flight(3)?;
/// } // unregistered here
/// assert_eq!(table.snapshot(0).map(|s| s.pid), Some(0));
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the registration unregisters the worker at once"]
pub struct Registration<'a> {
    table: &'a HeartbeatTable,
    slot: usize,
    /// The owner word of the registration it made (its slot may later hold another
    /// registration, also of this process: the guard never acts for that one).
    owner: u64,
    /// The lineage token of the process that registered (a forked child's copy acts for
    /// nothing).
    proc: u32,
}

impl HeartbeatTable {
    /// Registers this process (as [`register`](Self::register) with its own pid) and
    /// returns a guard that unregisters on drop.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub fn join(&self) -> Result<Registration<'_>, HeartbeatError> {
        self.join_as(std::process::id())
    }

    /// As [`join`](Self::join) for `pid` (registering on behalf of another process).
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub fn join_as(&self, pid: u32) -> Result<Registration<'_>, HeartbeatError> {
        let slot = self.register(pid)?;
        Ok(Registration {
            table: self,
            slot,
            owner: self.registered_owner(slot),
            proc: crate::liveness::current_proc(),
        })
    }
}

impl Registration<'_> {
    /// The slot index (for the seed's slot calls and for watchdog reports).
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Refreshes the heartbeat.
    ///
    /// # Errors
    /// [`HeartbeatError::Fenced`] if a watchdog declared this worker dead (its in-flight
    /// work was reclaimed): stop and register again.
    pub fn beat(&self) -> Result<(), HeartbeatError> {
        self.fenced_unless(self.table.beat_owned(self.slot, self.owner()))
    }

    /// Marks work unit `bit` (0..64) in flight.
    ///
    /// # Errors
    /// As [`beat`](Self::beat); [`HeartbeatError::BitOutOfRange`] for `bit >= 64`.
    pub fn mark_in_flight(&self, bit: u8) -> Result<(), HeartbeatError> {
        if bit >= 64 {
            return Err(HeartbeatError::BitOutOfRange { bit });
        }
        self.fenced_unless(self.table.update_owned(self.slot, bit, true, self.owner()))
    }

    /// Clears work unit `bit` (done).
    ///
    /// # Errors
    /// As [`mark_in_flight`](Self::mark_in_flight).
    pub fn clear_in_flight(&self, bit: u8) -> Result<(), HeartbeatError> {
        if bit >= 64 {
            return Err(HeartbeatError::BitOutOfRange { bit });
        }
        self.fenced_unless(self.table.update_owned(self.slot, bit, false, self.owner()))
    }

    /// The in-flight bitmap of this registration; `None` once it was fenced or reused.
    pub fn in_flight(&self) -> Option<u64> {
        self.table.in_flight_owned(self.slot, self.owner())
    }

    /// The registration this guard acts for: its own, in the process that made it (0,
    /// nothing, in a forked child).
    fn owner(&self) -> u64 {
        if self.proc == crate::liveness::current_proc() {
            self.owner
        } else {
            0
        }
    }

    fn fenced_unless(&self, ok: bool) -> Result<(), HeartbeatError> {
        if ok {
            Ok(())
        } else {
            Err(HeartbeatError::Fenced { slot: self.slot })
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let _ = self.table.unregister_owned(self.slot, self.owner());
    }
}

impl std::fmt::Debug for Registration<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("table", &self.table.path())
            .field("slot", &self.slot)
            .finish()
    }
}
