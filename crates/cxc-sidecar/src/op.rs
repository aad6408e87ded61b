//! Op codes: what an [`Observation`](crate::Observation) says happened.
//!
//! Codes are stable on file: the high byte names the primitive, the low byte the event.
//!
//! | range    | primitive   |
//! |----------|-------------|
//! | `0x00xx` | any (sidecar events) |
//! | `0x01xx` | `OwnerLease` |
//! | `0x02xx` | `HeartbeatTable` / `FailoverWatchdog` |
//! | `0x03xx` | `SharedSemaphore` |
//! | `0x05xx` | `SharedRwLock` |
//!
//! A reader built before a code was added sees it as [`OpCode::Unknown`] and keeps going.

use std::fmt;

use cxc_mmf::Kind;

/// What happened. The meaning of an observation's `arg` is given per variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum OpCode {
    /// A policy published a new strategy. `arg`: the handshake word
    /// ([`HandshakeHeader::word`](crate::HandshakeHeader::word)) after the change.
    StrategyChanged,

    /// Lease claimed while vacant. `arg`: the new generation.
    LeaseClaimVacant,
    /// Lease claimed by preempting a live higher-pid holder. `arg`: the new generation.
    LeaseClaimPreempt,
    /// Lease claimed from a holder whose heartbeat was stale. `arg`: the new generation.
    LeaseClaimStale,
    /// Lease claimed from a holder the OS proved dead. `arg`: the new generation.
    LeaseClaimDeadOwner,
    /// Lease released by its holder (`release`, `release_claim`, a guard's drop). `arg`:
    /// the released generation. A refused release is [`LeaseLossDetected`](Self::LeaseLossDetected).
    LeaseRelease,
    /// A holder learned it lost the lease (an owner operation failed). `arg`: its generation.
    LeaseLossDetected,
    /// A `write_claimed` with a superseded claim was refused (a refused `beat_claimed` or
    /// `release_claim` is [`LeaseLossDetected`](Self::LeaseLossDetected)). `arg`: the stale
    /// generation.
    LeaseStaleWriteRejected,
    /// A new holder inherited an interrupted write (its claim reports the payload may be
    /// inconsistent). `arg`: the new generation. Restorations are counted by the lease
    /// counter `torn_restored`, not recorded.
    LeaseTornRecovered,
    /// A blocking acquire had to wait. `arg`: the wait in nanoseconds; `flags`: `WAIT_*`.
    LeaseBlockedWait,

    /// A worker registered a heartbeat slot. `arg`: the slot index.
    HeartbeatRegister,
    /// A worker unregistered. `arg`: the slot index.
    HeartbeatUnregister,
    /// A scan ran. `arg`: the number of dead slots found.
    HeartbeatScan,
    /// A dead slot's in-flight bits were reclaimed. `arg`: the bits taken.
    HeartbeatReclaim,
    /// A beat from a worker already declared dead was refused. `arg`: the slot index.
    HeartbeatFencedBeat,

    /// A semaphore acquire had to wait. `arg`: the wait in nanoseconds; `flags`: `WAIT_*`.
    SemContended,
    /// A semaphore acquire timed out. `arg`: the wait in nanoseconds.
    SemTimeout,
    /// Permits of a dead process were reclaimed. `arg`: the number of permits.
    SemReclaim,
    /// A semaphore `release` was refused. `arg`: 1 if the pool was already at
    /// `max_permits`, 0 if the releasing process held no permit and none was handed off.
    SemOverflowRejected,

    /// A blocking read lock that missed its first try ended (got the lock, or gave up:
    /// flag `WAIT_TIMED_OUT`). `arg`: the wait in nanoseconds; `flags`: `WAIT_*`.
    RwReadWait,
    /// A blocking write lock that missed its first try ended (behind a writer or
    /// readers; got it, or gave up: flag `WAIT_TIMED_OUT`). `arg`: the wait in
    /// nanoseconds; `flags`: `WAIT_*`.
    RwWriteWait,
    /// A writer whose process died was evicted. `arg`: its fencing token.
    RwEvictDead,
    /// A writer that made no progress for the grace while others waited was evicted.
    /// `arg`: its fencing token.
    RwEvictStale,
    /// Holder slots of dead processes were reclaimed (their read holds dropped). `arg`:
    /// the number of slots.
    RwReclaim,
    /// A read, write, beat or unlock of an evicted writer was refused. `arg`: its token.
    RwStaleRejected,

    /// A code this build does not know (written by a newer build or a test).
    Unknown(u16),
}

/// Flag bits carried by an observation. Their meaning depends on the op code.
pub mod flags {
    /// Wait ops: the waiter got what it wanted while spinning, without parking.
    pub const WAIT_SPUN: u16 = 1 << 0;
    /// Wait ops: the waiter slept in the kernel at least once.
    pub const WAIT_PARKED: u16 = 1 << 1;
    /// Wait ops: the waiter gave up at its deadline.
    pub const WAIT_TIMED_OUT: u16 = 1 << 2;
    /// Reserved for [`LeaseTornRecovered`](super::OpCode::LeaseTornRecovered) marking a
    /// torn payload overwritten by the new holder. No primitive of this build sets it:
    /// restorations are counted (the lease counter `torn_restored`), not recorded.
    pub const RESTORED: u16 = 1 << 3;
}

/// Every known op code, in code order.
const KNOWN: [OpCode; 25] = [
    OpCode::StrategyChanged,
    OpCode::LeaseClaimVacant,
    OpCode::LeaseClaimPreempt,
    OpCode::LeaseClaimStale,
    OpCode::LeaseClaimDeadOwner,
    OpCode::LeaseRelease,
    OpCode::LeaseLossDetected,
    OpCode::LeaseStaleWriteRejected,
    OpCode::LeaseTornRecovered,
    OpCode::LeaseBlockedWait,
    OpCode::HeartbeatRegister,
    OpCode::HeartbeatUnregister,
    OpCode::HeartbeatScan,
    OpCode::HeartbeatReclaim,
    OpCode::HeartbeatFencedBeat,
    OpCode::SemContended,
    OpCode::SemTimeout,
    OpCode::SemReclaim,
    OpCode::SemOverflowRejected,
    OpCode::RwReadWait,
    OpCode::RwWriteWait,
    OpCode::RwEvictDead,
    OpCode::RwEvictStale,
    OpCode::RwReclaim,
    OpCode::RwStaleRejected,
];

impl OpCode {
    /// Every op code this build knows (not [`OpCode::Unknown`]).
    pub const ALL: &'static [OpCode] = &KNOWN;

    /// The stable on-file code.
    pub const fn code(self) -> u16 {
        match self {
            OpCode::StrategyChanged => 0x0001,
            OpCode::LeaseClaimVacant => 0x0101,
            OpCode::LeaseClaimPreempt => 0x0102,
            OpCode::LeaseClaimStale => 0x0103,
            OpCode::LeaseClaimDeadOwner => 0x0104,
            OpCode::LeaseRelease => 0x0105,
            OpCode::LeaseLossDetected => 0x0106,
            OpCode::LeaseStaleWriteRejected => 0x0107,
            OpCode::LeaseTornRecovered => 0x0108,
            OpCode::LeaseBlockedWait => 0x0109,
            OpCode::HeartbeatRegister => 0x0201,
            OpCode::HeartbeatUnregister => 0x0202,
            OpCode::HeartbeatScan => 0x0203,
            OpCode::HeartbeatReclaim => 0x0204,
            OpCode::HeartbeatFencedBeat => 0x0205,
            OpCode::SemContended => 0x0301,
            OpCode::SemTimeout => 0x0302,
            OpCode::SemReclaim => 0x0303,
            OpCode::SemOverflowRejected => 0x0304,
            OpCode::RwReadWait => 0x0501,
            OpCode::RwWriteWait => 0x0502,
            OpCode::RwEvictDead => 0x0503,
            OpCode::RwEvictStale => 0x0504,
            OpCode::RwReclaim => 0x0505,
            OpCode::RwStaleRejected => 0x0506,
            OpCode::Unknown(c) => c,
        }
    }

    /// The op code for an on-file code; codes this build does not know become
    /// [`OpCode::Unknown`]. `from_u16(c).code() == c` for every `c`.
    pub const fn from_u16(code: u16) -> OpCode {
        match code {
            0x0001 => OpCode::StrategyChanged,
            0x0101 => OpCode::LeaseClaimVacant,
            0x0102 => OpCode::LeaseClaimPreempt,
            0x0103 => OpCode::LeaseClaimStale,
            0x0104 => OpCode::LeaseClaimDeadOwner,
            0x0105 => OpCode::LeaseRelease,
            0x0106 => OpCode::LeaseLossDetected,
            0x0107 => OpCode::LeaseStaleWriteRejected,
            0x0108 => OpCode::LeaseTornRecovered,
            0x0109 => OpCode::LeaseBlockedWait,
            0x0201 => OpCode::HeartbeatRegister,
            0x0202 => OpCode::HeartbeatUnregister,
            0x0203 => OpCode::HeartbeatScan,
            0x0204 => OpCode::HeartbeatReclaim,
            0x0205 => OpCode::HeartbeatFencedBeat,
            0x0301 => OpCode::SemContended,
            0x0302 => OpCode::SemTimeout,
            0x0303 => OpCode::SemReclaim,
            0x0304 => OpCode::SemOverflowRejected,
            0x0501 => OpCode::RwReadWait,
            0x0502 => OpCode::RwWriteWait,
            0x0503 => OpCode::RwEvictDead,
            0x0504 => OpCode::RwEvictStale,
            0x0505 => OpCode::RwReclaim,
            0x0506 => OpCode::RwStaleRejected,
            c => OpCode::Unknown(c),
        }
    }

    /// A dotted lower-case name, as the CLI and metrics print it (`"unknown"` for
    /// [`OpCode::Unknown`]).
    pub const fn name(self) -> &'static str {
        match self {
            OpCode::StrategyChanged => "strategy.changed",
            OpCode::LeaseClaimVacant => "lease.claim.vacant",
            OpCode::LeaseClaimPreempt => "lease.claim.preempt",
            OpCode::LeaseClaimStale => "lease.claim.stale",
            OpCode::LeaseClaimDeadOwner => "lease.claim.dead_owner",
            OpCode::LeaseRelease => "lease.release",
            OpCode::LeaseLossDetected => "lease.loss_detected",
            OpCode::LeaseStaleWriteRejected => "lease.stale_write_rejected",
            OpCode::LeaseTornRecovered => "lease.torn_recovered",
            OpCode::LeaseBlockedWait => "lease.blocked_wait",
            OpCode::HeartbeatRegister => "heartbeat.register",
            OpCode::HeartbeatUnregister => "heartbeat.unregister",
            OpCode::HeartbeatScan => "heartbeat.scan",
            OpCode::HeartbeatReclaim => "heartbeat.reclaim",
            OpCode::HeartbeatFencedBeat => "heartbeat.fenced_beat",
            OpCode::SemContended => "semaphore.contended",
            OpCode::SemTimeout => "semaphore.timeout",
            OpCode::SemReclaim => "semaphore.reclaim",
            OpCode::SemOverflowRejected => "semaphore.overflow_rejected",
            OpCode::RwReadWait => "rwlock.read_wait",
            OpCode::RwWriteWait => "rwlock.write_wait",
            OpCode::RwEvictDead => "rwlock.evict.dead",
            OpCode::RwEvictStale => "rwlock.evict.stale",
            OpCode::RwReclaim => "rwlock.reclaim",
            OpCode::RwStaleRejected => "rwlock.stale_rejected",
            OpCode::Unknown(_) => "unknown",
        }
    }

    /// The primitive this op belongs to, from the code's high byte (`None` for sidecar
    /// events and unknown ranges).
    pub const fn primitive(self) -> Option<Kind> {
        match self.code() >> 8 {
            0x01 => Some(Kind::Lease),
            0x02 => Some(Kind::Heartbeat),
            0x03 => Some(Kind::Semaphore),
            0x05 => Some(Kind::RwLock),
            _ => None,
        }
    }

    /// Whether `arg` of this op is a wait duration in nanoseconds (the input of
    /// [`AdaptiveSpin`](crate::AdaptiveSpin)).
    pub const fn is_wait(self) -> bool {
        matches!(
            self,
            OpCode::LeaseBlockedWait
                | OpCode::SemContended
                | OpCode::SemTimeout
                | OpCode::RwReadWait
                | OpCode::RwWriteWait
        )
    }
}

impl fmt::Display for OpCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpCode::Unknown(c) => write!(f, "unknown({c:#06x})"),
            op => f.write_str(op.name()),
        }
    }
}

impl From<OpCode> for u16 {
    fn from(op: OpCode) -> u16 {
        op.code()
    }
}

impl From<u16> for OpCode {
    fn from(code: u16) -> OpCode {
        OpCode::from_u16(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for &op in OpCode::ALL {
            assert_eq!(OpCode::from_u16(op.code()), op);
            assert!(seen.insert(op.code()), "duplicate code {:#x}", op.code());
            assert_ne!(op.name(), "unknown");
        }
        for c in 0..=u16::MAX {
            assert_eq!(OpCode::from_u16(c).code(), c);
        }
        assert_eq!(OpCode::from_u16(0x7777), OpCode::Unknown(0x7777));
        assert_eq!(OpCode::Unknown(0x7777).to_string(), "unknown(0x7777)");
    }

    #[test]
    fn grouped_by_primitive() {
        assert_eq!(OpCode::LeaseRelease.primitive(), Some(Kind::Lease));
        assert_eq!(OpCode::HeartbeatScan.primitive(), Some(Kind::Heartbeat));
        assert_eq!(OpCode::SemReclaim.primitive(), Some(Kind::Semaphore));
        assert_eq!(OpCode::StrategyChanged.primitive(), None);
        assert!(OpCode::SemContended.is_wait() && !OpCode::SemReclaim.is_wait());
        assert_eq!(OpCode::RwEvictDead.primitive(), Some(Kind::RwLock));
        assert!(OpCode::RwWriteWait.is_wait() && !OpCode::RwReclaim.is_wait());
    }
}
