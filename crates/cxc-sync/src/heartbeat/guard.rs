//! [`Registration`] and [`OwnedRegistration`]: a heartbeat-table slot that unregisters
//! when dropped.

use std::sync::Arc;

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
    reg: Made,
}

/// A [`Registration`] that owns (an `Arc` of) its table, for a caller that cannot keep a
/// borrow (a registration stored in a struct, moved to a thread, or held by a binding):
/// made by [`HeartbeatTable::join_owned`] or [`join_owned_as`](HeartbeatTable::join_owned_as).
/// It acts only for the registration it made, like a `Registration`, and unregisters it
/// when dropped.
///
/// # Examples
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// use std::sync::Arc;
/// use cxc_sync::HeartbeatTable;
/// let table = Arc::new(HeartbeatTable::create(dir.path().join("w.hb"), 8)?);
/// let me = table.clone().join_owned()?;
/// std::thread::spawn(move || {
///     me.mark_in_flight(1)?;
///     me.beat()?;
///     me.clear_in_flight(1)
/// })
/// .join()
/// .unwrap()?;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping the registration unregisters the worker at once"]
pub struct OwnedRegistration {
    table: Arc<HeartbeatTable>,
    reg: Made,
}

/// What a registration guard knows of the registration it made.
#[derive(Debug, Clone, Copy)]
struct Made {
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
        let reg = self.made(pid)?;
        Ok(Registration { table: self, reg })
    }

    /// As [`join`](Self::join), returning a guard that owns the `Arc` of the table.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub fn join_owned(self: Arc<Self>) -> Result<OwnedRegistration, HeartbeatError> {
        self.join_owned_as(std::process::id())
    }

    /// As [`join_as`](Self::join_as), returning a guard that owns the `Arc` of the table.
    ///
    /// # Errors
    /// As [`register`](Self::register).
    pub fn join_owned_as(self: Arc<Self>, pid: u32) -> Result<OwnedRegistration, HeartbeatError> {
        let reg = self.made(pid)?;
        Ok(OwnedRegistration { table: self, reg })
    }

    fn made(&self, pid: u32) -> Result<Made, HeartbeatError> {
        let slot = self.register(pid)?;
        Ok(Made {
            slot,
            owner: self.registered_owner(slot),
            proc: crate::liveness::current_proc(),
        })
    }
}

impl Made {
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

    fn beat(&self, table: &HeartbeatTable) -> Result<(), HeartbeatError> {
        self.fenced_unless(table.beat_owned(self.slot, self.owner()))
    }

    fn update(&self, table: &HeartbeatTable, bit: u8, set: bool) -> Result<(), HeartbeatError> {
        if bit >= 64 {
            return Err(HeartbeatError::BitOutOfRange { bit });
        }
        self.fenced_unless(table.update_owned(self.slot, bit, set, self.owner()))
    }

    fn in_flight(&self, table: &HeartbeatTable) -> Option<u64> {
        table.in_flight_owned(self.slot, self.owner())
    }

    fn unregister(&self, table: &HeartbeatTable) -> bool {
        table.unregister_owned(self.slot, self.owner())
    }
}

/// The methods of both guards (same text, same behaviour).
macro_rules! registration_methods {
    () => {
        /// The slot index (for the seed's slot calls and for watchdog reports).
        pub fn slot(&self) -> usize {
            self.reg.slot
        }

        /// Refreshes the heartbeat.
        ///
        /// # Errors
        /// [`HeartbeatError::Fenced`] if a watchdog declared this worker dead (its
        /// in-flight work was reclaimed), or the registration is no longer in its slot:
        /// stop and register again.
        pub fn beat(&self) -> Result<(), HeartbeatError> {
            self.reg.beat(&self.table)
        }

        /// Marks work unit `bit` (0..64) in flight.
        ///
        /// # Errors
        /// As [`beat`](Self::beat); [`HeartbeatError::BitOutOfRange`] for `bit >= 64`.
        pub fn mark_in_flight(&self, bit: u8) -> Result<(), HeartbeatError> {
            self.reg.update(&self.table, bit, true)
        }

        /// Clears work unit `bit` (done).
        ///
        /// # Errors
        /// As [`mark_in_flight`](Self::mark_in_flight).
        pub fn clear_in_flight(&self, bit: u8) -> Result<(), HeartbeatError> {
            self.reg.update(&self.table, bit, false)
        }

        /// The in-flight bitmap of this registration; `None` once it was fenced or reused.
        pub fn in_flight(&self) -> Option<u64> {
            self.reg.in_flight(&self.table)
        }
    };
}

impl Registration<'_> {
    registration_methods!();
}

impl OwnedRegistration {
    registration_methods!();

    /// The table.
    pub fn table(&self) -> &Arc<HeartbeatTable> {
        &self.table
    }

    /// Unregisters now (as dropping does); `false` if the registration was no longer in
    /// its slot (fenced and reused, or in a forked child's copy).
    pub fn unregister(mut self) -> bool {
        let ok = self.reg.unregister(&self.table);
        // Owner word 0 acts for nothing: the drop that follows changes nothing.
        self.reg.owner = 0;
        ok
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        let _ = self.reg.unregister(self.table);
    }
}

impl Drop for OwnedRegistration {
    fn drop(&mut self) {
        let _ = self.reg.unregister(&self.table);
    }
}

impl std::fmt::Debug for Registration<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("table", &self.table.path())
            .field("slot", &self.reg.slot)
            .finish()
    }
}

impl std::fmt::Debug for OwnedRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedRegistration")
            .field("table", &self.table.path())
            .field("slot", &self.reg.slot)
            .finish()
    }
}
