//! Writer lanes: each thread of a process has an index (its lane) into every handle's
//! lane table, and a lane binds one writer slot of the shared state to that thread, so a
//! slot has one writer at a time with no per-write lock. A lane also remembers the last
//! `pub_word` its slot published or saw, so a write needs no load of `pub_word` before
//! its CAS (`docs/seqlock.md`, "Write").

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use cxc_mmf::identity::{Identity, Liveness, current_proc, liveness};

use super::state::{SeqState, Verdict};

/// Writer lanes per handle (thread indices); threads beyond them share one more lane
/// under a mutex.
pub(crate) const LANES: usize = 64;
/// The shared lane.
pub(crate) const SHARED_LANE: usize = LANES;
const _: () = assert!(LANES.is_power_of_two());

/// Thread indices `0..LANES`, unique among the live threads of this process (an index
/// is reused only after its thread exited).
static NEXT_LANE: AtomicUsize = AtomicUsize::new(0);
/// Indices given back by exited threads (bit `i` = index `i` is free). A bitmap changed
/// by single atomic operations, not a list under a mutex: a child made by `fork` while
/// another thread held such a mutex would wait for it forever.
static FREE_LANES: AtomicU64 = AtomicU64::new(0);
const _: () = assert!(LANES <= 64);

/// Gives index `i` back.
fn free_lane(i: usize) {
    FREE_LANES.fetch_or(1 << i, Ordering::AcqRel);
}

/// Takes a given-back index, if any.
fn take_free_lane() -> Option<usize> {
    let mut free = FREE_LANES.load(Ordering::Acquire);
    while free != 0 {
        let i = free.trailing_zeros() as usize;
        match FREE_LANES.compare_exchange_weak(
            free,
            free & !(1 << i),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Some(i),
            Err(now) => free = now,
        }
    }
    None
}

/// Gives this thread's index back when the thread exits (set when it is assigned).
struct LaneRelease(Cell<usize>);

impl Drop for LaneRelease {
    fn drop(&mut self) {
        let v = self.0.get();
        if (1..=LANES).contains(&v) {
            // No write of this thread can follow: its index may go to a new thread.
            LANE.with(|l| l.set(usize::MAX));
            free_lane(v - 1);
        }
    }
}

thread_local! {
    /// This thread's index + 1 (0 = not assigned yet; `usize::MAX` = none: every index
    /// is taken, or the thread is exiting). No destructor, so the fast path is one
    /// thread-local load.
    static LANE: Cell<usize> = const { Cell::new(0) };
    static LANE_RELEASE: LaneRelease = const { LaneRelease(Cell::new(0)) };
}

/// This thread's lane index, or `None` (the shared lane) if every index is taken or the
/// thread is exiting.
#[inline(always)]
pub(crate) fn thread_lane() -> Option<usize> {
    match LANE.with(Cell::get) {
        0 => assign_lane(),
        v if v <= LANES => Some(v - 1),
        _ => None,
    }
}

#[cold]
#[inline(never)]
fn assign_lane() -> Option<usize> {
    let i = take_free_lane().or_else(|| {
        NEXT_LANE
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < LANES).then_some(n + 1)
            })
            .ok()
    });
    let v = i.map_or(usize::MAX, |i| i + 1);
    // Registers the destructor that gives the index back; a thread already exiting
    // (its destructors running) gets none and uses the shared lane.
    if i.is_some() && LANE_RELEASE.try_with(|r| r.0.set(v)).is_err() {
        if let Some(i) = i {
            free_lane(i);
        }
        LANE.with(|l| l.set(usize::MAX));
        return None;
    }
    LANE.with(|l| l.set(v));
    i
}

/// Marks a known `seen` word in [`Lane::seen`] (`pub_word` values stay below 2^63: the
/// version would need 2^55 publications to reach it).
const SEEN_KNOWN: u64 = 1 << 63;

/// One lane of a handle: the writer slot bound to it and the last `pub_word` value that
/// slot published or saw. Used by one thread at a time (a thread lane by its thread, the
/// shared lane under the handle's mutex), so relaxed accesses suffice.
#[derive(Debug, Default)]
pub(crate) struct Lane {
    /// `pid << 32 | (slot + 1)`, 0 = none: the slot reserved for this lane by process
    /// `pid` (a forked child's copy names its parent's slot, which it must not use).
    slot: AtomicU64,
    /// [`SEEN_KNOWN`] `|` a `pub_word` value that the slot's writer published, or saw
    /// after its latest publication (0 = unknown: a fresh binding).
    seen: AtomicU64,
}

impl Lane {
    /// The slot bound to this lane for this process.
    #[inline(always)]
    pub(crate) fn slot(&self) -> Option<usize> {
        let l = self.slot.load(Ordering::Relaxed);
        (l != 0 && (l >> 32) as u32 == current_proc()).then(|| (l as u32 - 1) as usize)
    }

    /// The slot bound to this lane by process `pid`, if any (for the handle's drop).
    pub(crate) fn slot_of(&self, pid: u32) -> Option<usize> {
        let l = self.slot.load(Ordering::Relaxed);
        (l != 0 && (l >> 32) as u32 == pid).then(|| (l as u32 - 1) as usize)
    }

    /// Binds `slot`, just reserved by this process, to this lane; what the lane saw of
    /// an earlier slot is forgotten.
    pub(crate) fn bind(&self, slot: usize) {
        self.seen.store(0, Ordering::Relaxed);
        self.slot.store(
            u64::from(current_proc()) << 32 | (slot as u64 + 1),
            Ordering::Relaxed,
        );
    }

    /// The `pub_word` value this lane's slot last published or saw after its latest
    /// publication, if known.
    #[inline(always)]
    pub(crate) fn seen(&self) -> Option<u64> {
        let s = self.seen.load(Ordering::Relaxed);
        (s != 0).then_some(s & !SEEN_KNOWN)
    }

    /// Records `p`: a value the slot just published, or a `pub_word` value seen after the
    /// slot's latest publication.
    #[inline(always)]
    pub(crate) fn set_seen(&self, p: u64) {
        self.seen.store(p | SEEN_KNOWN, Ordering::Relaxed);
    }
}

/// The OS's verdict on the process that reserved slot `i`: `Dead` only if proven (a slot
/// freed or re-reserved since counts as its holder gone only when freed).
pub(crate) fn judge_slot(st: &SeqState, i: usize) -> Verdict {
    match st.slot_ident(i) {
        None => Verdict::Dead,
        Some(w) => match liveness(&Identity::from_words(w)) {
            Liveness::Dead => Verdict::Dead,
            Liveness::Alive | Liveness::Unknown => Verdict::Alive,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::SeqLock;

    /// A thread alternating `update`s (which publish from a fresh load of `pub_word`)
    /// and `write`s (which start from the lane's `seen`), while a reader checks every
    /// value, then the same with a second writer: an `update` must leave the lane's
    /// `seen` naming the buffer it published, or the next `write` fills the published
    /// buffer under the reader's eyes.
    #[test]
    fn writes_after_updates_never_fill_the_published_buffer() {
        for second_writer in [false, true] {
            let lock = SeqLock::new([0u64; 6]).unwrap();
            let stop = AtomicBool::new(false);
            let reads = std::sync::atomic::AtomicU64::new(0);
            std::thread::scope(|s| {
                let reader = s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let v = lock.read();
                        assert!(v.iter().all(|w| *w == v[0]), "torn read {v:?}");
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                });
                let other = second_writer.then(|| {
                    s.spawn(|| {
                        for i in 0..20_000u64 {
                            lock.write([i << 32; 6]).unwrap();
                        }
                    })
                });
                // 100k writes, and on until the reader has read 1000 times while they
                // go on (on a loaded 2-core machine it may not run at first), at most
                // for 20 s.
                let started = std::time::Instant::now();
                let mut i = 0u64;
                while i < 100_000
                    || (reads.load(Ordering::Relaxed) < 1000
                        && started.elapsed() < std::time::Duration::from_secs(20))
                {
                    if i.is_multiple_of(2) {
                        lock.update(|v| *v = [v[0] + 1; 6]).ok();
                    } else {
                        lock.write([i; 6]).unwrap();
                    }
                    i += 1;
                }
                if let Some(o) = other {
                    o.join().unwrap();
                }
                stop.store(true, Ordering::Relaxed);
                reader.join().unwrap();
                assert!(reads.load(Ordering::Relaxed) >= 1000, "the reader hardly ran");
            });
        }
    }
}
