//! [`ObservationRing`]: a fixed-size, multi-producer, lossy ring of observations that lives
//! inside a primitive's file.
//!
//! # Protocol
//!
//! Producers (any thread of any process) take a ticket with one `fetch_add` on `head`; the
//! ticket's slot is `ticket % RING_CAPACITY`. Each slot has a sequence word:
//!
//! | `seq`          | meaning                                             |
//! |----------------|-----------------------------------------------------|
//! | 0              | never written (an all-zero ring is empty)           |
//! | `2 * t + 1`    | the producer of ticket `t` is writing               |
//! | `2 * t + 2`    | ticket `t` is published                             |
//!
//! The producer of ticket `t` claims the slot by CAS from any value naming an *older* ticket
//! (published, or still being written by a producer one lap behind that stalled or died) to
//! `2t+1`; if the slot already names ticket `t` or newer, it was overtaken and drops its
//! entry. So `seq` only ever grows, and a slot has at most one claimant at a time unless a
//! claimant stalled for a whole lap. It then writes the fields and a checksum over
//! (ticket, fields), and publishes with a CAS `2t+1 -> 2t+2` that fails if a later ticket
//! took the slot over meanwhile.
//!
//! A reader of position `p` accepts the slot only if `seq == 2p+2` before and after reading
//! the fields (seqlock: Acquire load, fields, Acquire fence, load) **and** the checksum over
//! `p` and the fields verifies. The second `seq` check rejects every overwrite by a newer
//! ticket; the checksum rejects the one case the sequence cannot see, stray stores of a
//! producer that stalled a whole lap mid-write (it computed its checksum over a different
//! ticket). A torn entry is accepted only on a 64-bit hash collision.
//!
//! A producer that dies mid-entry leaves an odd `seq`; readers wait for an unfinished entry
//! only briefly (a few spins and yields, 200 µs per read in all), then count it as lost and go on. The next lap's
//! producer takes the slot over. Readers never spin unboundedly on state left by a crashed
//! process, and every index is reduced modulo the capacity, so a corrupt file cannot make
//! a reader or producer touch memory outside the ring.

//!
//! Files: `slot` (a slot and its word encodings), `block` (the in-file block),
//! `observation` (what readers get), `produce` (recording), `read` (validating reads).

mod block;
mod observation;
mod produce;
mod read;
mod slot;
#[cfg(test)]
mod tests;

pub use block::ObservationRing;
pub use observation::{Observation, ReadBatch};
pub use slot::RING_CAPACITY;
