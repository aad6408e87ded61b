//! What readers get: [`Observation`], [`ReadBatch`], and the outcome of reading one slot.

use std::fmt;

use crate::op::OpCode;

/// One event read from a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Observation {
    /// Position in the ring's history (the producer's ticket): increases by one per event,
    /// across all producers.
    pub ticket: u64,
    /// `CLOCK_MONOTONIC` nanoseconds when it was recorded ([`monotonic_ns`](crate::clock::monotonic_ns)).
    pub timestamp_ns: u64,
    /// Pid of the recording process.
    pub pid: u32,
    /// What happened.
    pub op: OpCode,
    /// Op-specific flag bits (see [`flags`](crate::flags)).
    pub flags: u16,
    /// Op-specific argument (see [`OpCode`]).
    pub arg: u64,
}

impl Observation {
    /// The wait duration in nanoseconds, if this is a wait op ([`OpCode::is_wait`]).
    pub fn wait_ns(&self) -> Option<u64> {
        self.op.is_wait().then_some(self.arg)
    }
}

impl fmt::Display for Observation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#{} t={}ns pid={} {} flags={:#x} arg={}",
            self.ticket, self.timestamp_ns, self.pid, self.op, self.flags, self.arg
        )
    }
}

/// What one [`ObservationRing::read_since`](super::block::ObservationRing::read_since) returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadBatch {
    /// Intact entries, in ticket order.
    pub observations: Vec<Observation>,
    /// The cursor to pass to the next call (the ring's head when this call read it).
    pub next: u64,
    /// Positions between the cursor and `next` that were not returned: overwritten before
    /// they were read, unfinished (producer stalled or died), or rejected as torn.
    /// `observations.len() + lost == next - cursor`.
    pub lost: u64,
    /// The part of `lost` whose slot named the right ticket but failed the checksum.
    pub rejected: u64,
}

/// The outcome of reading one position.
pub(super) enum SlotRead {
    Ok(Observation),
    /// Overwritten by a later ticket.
    Gone,
    /// Not (yet) published by its producer.
    Pending,
    /// The right ticket, but the checksum failed.
    Rejected,
}
