//! The slot protocol: register, beat, mark/clear in-flight bits, unregister, consistent
//! snapshots, and the watchdog's fence-and-take. Written against the atomics shim so the
//! loom models run the very same code on heap-allocated slots.
//!
//! Ordering argument (see `docs/heartbeat.md` for the long form):
//!
//! - Every write to a bitmap half is a CAS that checks the half's tag. Workers need their
//!   live tag; the watchdog retags a half to the fenced tag in the same CAS that takes or
//!   erases bits; `register` closes a free slot's halves (fenced tag, no bits) before it
//!   claims the owner word and only then retags them live for the new generation. So a
//!   stale worker (declared dead, or a thread that raced with its own `unregister`) can
//!   never set or clear a bit after its halves were retagged, and every bit set by a
//!   successful `mark` is either cleared by its owner or taken by exactly one watchdog.
//! - The owner word is the slot's identity: one CAS moves it LIVE -> FENCED (fencing:
//!   only one watchdog wins) and FREE/FENCED -> LIVE(new generation) (registration).
//!   Generations only grow, so a watchdog acting on an old snapshot fails its CAS or its
//!   tag check instead of touching the new registration.

use cxc_mmf::identity::{FALLBACK_BIT, Identity};

use super::layout::*;
use crate::primitive::{AtomicU64, Ordering, fence, spin_hint};

/// How many times a snapshot re-reads a slot whose owner word keeps changing.
pub(crate) const SNAPSHOT_RETRIES: usize = 16;

/// A consistent picture of one slot (property H1): every field belongs to the same
/// registration, because the owner word (pid, generation, FENCED) read before and after
/// the other fields was the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeartbeatSnapshot {
    /// Registered process id; 0 for a free slot.
    pub pid: u32,
    /// Epoch of the last beat (or of the registration).
    pub last_seen_epoch: u64,
    /// In-flight bits of this registration (bit `b` = work unit tracked as `b`).
    pub in_flight_bitmap: u64,
    /// Registration generation (31 bits); grows by one on every `register` of the slot.
    pub generation: u64,
    /// The slot was fenced: declared dead by a watchdog (or unregistered with bits left).
    /// Its worker's `beat`/`mark_in_flight`/`clear_in_flight` fail.
    pub fenced: bool,
    /// Start time of the registered process (clock ticks since boot) when its recorded
    /// identity has the fallback form; 0 otherwise (pidfs identity, or unknown).
    pub start_time: u64,
    /// Identity of the process the slot was registered for, looked up at registration;
    /// unknown (`!is_known()`) for a pid that could not be identified, or for a snapshot
    /// taken while the registration was still writing it.
    pub identity: Identity,
}

impl HeartbeatSnapshot {
    /// The owner word this snapshot was taken under.
    #[inline]
    #[cfg_attr(cxc_loom, allow(dead_code))]
    pub(crate) fn owner_word(&self) -> Option<u64> {
        (self.pid != 0 && self.generation <= u64::from(GEN_MASK))
            .then(|| owner_word(self.pid, self.generation as u32, self.fenced))
    }

    fn build(owner: u64, lo: u64, hi: u64, last_seen: u64, identity: Identity) -> Self {
        let pid = pid_of(owner);
        let generation = gen_of(owner);
        let bits = |half: u64| {
            if gen_of(u64::from(half_tag(half))) == generation {
                u64::from(half_bits(half))
            } else {
                0
            }
        };
        HeartbeatSnapshot {
            pid,
            last_seen_epoch: last_seen,
            in_flight_bitmap: bits(lo) | (bits(hi) << 32),
            generation: u64::from(generation),
            fenced: pid != 0 && is_fenced(owner),
            start_time: if pid != 0 && identity.is_fallback() {
                identity.unique & !FALLBACK_BIT
            } else {
                0
            },
            identity: if pid != 0 {
                identity
            } else {
                Identity::default()
            },
        }
    }
}

/// Whether a watchdog reports this snapshot as dead (the seed's rule plus fencing and OS
/// identity): a registered slot with in-flight bits that is fenced, or has missed
/// STRICTLY more than `grace` epochs (`lag == grace` is alive), or whose process the OS
/// says is gone (`os_dead`).
#[inline]
pub(crate) fn is_reportable(snap: &HeartbeatSnapshot, now: u64, grace: u64, os_dead: bool) -> bool {
    snap.pid != 0
        && snap.in_flight_bitmap != 0
        && (snap.fenced || now.saturating_sub(snap.last_seen_epoch) > grace || os_dead)
}

/// Which slots `try_claim` may take.
pub(crate) enum ClaimRule<'a> {
    /// Free slots and fenced slots whose bits are all gone.
    FreeOrFenced,
    /// Live slots with no bits whose recorded process is dead by OS identity
    /// (`is_dead(identity)`).
    OsDead(&'a dyn Fn(&Identity) -> bool),
}

/// What `try_claim` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Claimed: the new owner word, and whether the slot had been used before.
    Won { owner: u64, reused: bool },
    /// Not claimable under the rule (or lost a race).
    No,
}

impl HeartbeatSlot {
    #[inline]
    fn half(&self, bit: u8) -> (&AtomicU64, u32) {
        if bit < 32 {
            (&self.lo, 1u32 << bit)
        } else {
            (&self.hi, 1u32 << (bit - 32))
        }
    }

    /// Claims this slot for `pid` if `rule` allows it. `now` is the current epoch,
    /// `identity` the identity to record for `pid` (unknown allowed).
    pub(crate) fn try_claim(
        &self,
        pid: u32,
        identity: &Identity,
        now: u64,
        rule: &ClaimRule<'_>,
    ) -> Claim {
        debug_assert!(pid != 0);
        let mut seen = self.owner.load(Ordering::Acquire);
        let generation = gen_of(seen);
        let allowed = match rule {
            ClaimRule::FreeOrFenced => pid_of(seen) == 0 || is_fenced(seen),
            ClaimRule::OsDead(is_dead) => {
                pid_of(seen) != 0 && !is_fenced(seen) && {
                    let id = self.identity(seen);
                    // Cheap test first: only empty slots are candidates.
                    id.is_known()
                        && half_bits(self.lo.load(Ordering::Acquire)) == 0
                        && half_bits(self.hi.load(Ordering::Acquire)) == 0
                        && is_dead(&id)
                }
            }
        };
        if !allowed {
            return Claim::No;
        }
        if let ClaimRule::OsDead(_) = rule {
            // Fence the dead registration first, as a watchdog would. Its registrant may
            // still be inside `register` (registering on behalf of a pid that is already
            // dead) and set its live tag late on a half we close below; with the owner
            // word no longer its, it can add no bit with that tag (`update_bit` checks
            // the owner), so the window between the close and our owner CAS is as safe
            // as in the free-or-fenced case. If the close then finds bits, the slot stays
            // fenced with them: the next scan reports them (H2).
            if self.fence(seen) != Some(true) {
                return Claim::No;
            }
            seen |= FENCED_BIT;
        }
        if !self.close_empty_halves(generation) {
            return Claim::No;
        }
        // Both halves now carry a non-live tag and no bits, and nobody can add bits to
        // them (a worker's CAS needs its live tag), so the slot is empty until we retag.
        // Publish a fresh last_seen before the claim so no snapshot pairs the new owner
        // with the previous registration's (possibly ancient) last_seen. A racing loser
        // only ever raises last_seen of a free or fenced slot, which changes no report.
        self.last_seen.fetch_max(now, Ordering::Release);
        let new_gen = next_gen(generation);
        let new = owner_word(pid, new_gen, false);
        // SYNC: owner-claim. AcqRel: pairs with the Acquire owner loads of snapshots and
        // scans (they see last_seen >= now) and with the previous owner's/watchdog's
        // Release transitions.
        if self
            .owner
            .compare_exchange(seen, new, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Claim::No;
        }
        // From here on a stall of any length is possible (a SIGSTOP, a preempted thread):
        // a watchdog may fence this registration and another registrant take the slot
        // before we go on. So the identity and the halves are written only by CAS, and
        // only over values of older registrations: a registrant that finds a newer one
        // there gives up and leaves everything as it found it.
        if !self.write_identity(identity, new) {
            return Claim::No;
        }
        if !(self.retag_live(&self.lo, new) && self.retag_live(&self.hi, new)) {
            return Claim::No;
        }
        Claim::Won {
            owner: new,
            reused: generation != 0,
        }
    }

    /// Retags a closed `half` live for the registration `owner` (no bits). A half is
    /// closed for us if it has no bits and carries no live tag of a newer generation: a
    /// fenced tag, a never-used one, or the live tag of an older registration whose
    /// registrant stalled before its own retag and set it late. False if a newer
    /// registration owns the half (ours was fenced and replaced meanwhile); the half is
    /// then left alone. (A newer live tag while the owner word is still ours can only be
    /// garbage written into the file: it is overwritten.)
    fn retag_live(&self, half: &AtomicU64, owner: u64) -> bool {
        let tag = tag_of(owner);
        let mut cur = half.load(Ordering::Acquire);
        loop {
            if half_tag(cur) == tag && half_bits(cur) == 0 {
                return true;
            }
            let other = half_tag(cur);
            let newer_live = other != 0
                && other & 1 == 0
                && gen_newer(gen_of(u64::from(other)), gen_of(u64::from(tag)));
            if half_bits(cur) != 0 || (newer_live && self.owner.load(Ordering::Acquire) != owner) {
                return false;
            }
            // SYNC: half-retag. Release: the identity and last_seen stores above are
            // visible to anyone who Acquire-loads a half carrying the new live tag (or a
            // later value in its release sequence, i.e. after a worker's mark).
            match half.compare_exchange(cur, half_word(tag, 0), Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    /// Records `identity` for the registration `owner`. False if a newer registration owns
    /// the record (ours was fenced and replaced while we stalled).
    ///
    /// `id_gen` says whose the words are: `generation | ID_BUSY` while that registration
    /// writes them, `generation | ID_MIXED` once they are complete. A registrant takes the
    /// record from any older generation with one CAS on `id_gen`, then writes each word
    /// with a CAS from the value it loaded, re-checking `id_gen` between the load and the
    /// CAS; a registrant that was replaced meanwhile either sees the newer `id_gen` or
    /// fails its CAS, because the newer one's values differ from every older value: each
    /// word is stored XORed with a mix of its generation ([`id_word`]), so even the same
    /// process registering again writes new values. The words of the newest registrant
    /// therefore stay once written, whatever a stalled older one does when it resumes.
    fn write_identity(&self, identity: &Identity, owner: u64) -> bool {
        let generation = gen_of(owner);
        let mut g = self.id_gen.load(Ordering::Acquire);
        loop {
            let theirs = (g & u64::from(GEN_MASK)) as u32;
            // Not older than ours: a newer registrant's, unless the owner word is still
            // ours (then it is garbage written into the file, and taken like an old one).
            if (theirs == generation || gen_newer(theirs, generation))
                && self.owner.load(Ordering::Acquire) != owner
            {
                return false;
            }
            // SYNC: slot-identity. AcqRel: takes the record; pairs with the Acquire loads
            // of an older registrant's word writes below.
            match self.id_gen.compare_exchange(
                g,
                u64::from(generation) | ID_BUSY,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(v) => g = v,
            }
        }
        let busy = u64::from(generation) | ID_BUSY;
        let words = [identity.unique, identity.pidns, identity.boot];
        for (i, (word, value)) in self.id_words().into_iter().zip(words).enumerate() {
            let want = id_word(value, generation, i);
            loop {
                // SYNC: slot-identity. Acquire: if `cur` is a newer registrant's value, the
                // `id_gen` load below sees that registrant's takeover (or later).
                let cur = word.load(Ordering::Acquire);
                if self.id_gen.load(Ordering::Acquire) != busy {
                    return false;
                }
                if cur == want {
                    break;
                }
                // SYNC: slot-identity (Release: see the Acquire load above).
                if word
                    .compare_exchange(cur, want, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    break;
                }
            }
        }
        // SYNC: slot-identity (Release; pairs with the Acquire load in `identity`).
        self.id_gen
            .compare_exchange(
                busy,
                u64::from(generation) | ID_MIXED,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// The three identity words, in [`id_word`] index order.
    fn id_words(&self) -> [&AtomicU64; 3] {
        [&self.id_unique, &self.id_pidns, &self.id_boot]
    }

    /// The identity recorded for the registration `owner` (its pid is the owner word's);
    /// unknown if the words belong to another generation or are being written.
    pub(crate) fn identity(&self, owner: u64) -> Identity {
        let generation = gen_of(owner);
        // SYNC: slot-identity (Acquire; pairs with the Release CAS in `write_identity`).
        let g1 = self.id_gen.load(Ordering::Acquire);
        if g1 != u64::from(generation) | ID_MIXED || pid_of(owner) == 0 {
            return Identity::default();
        }
        let [unique, pidns, boot] = self.id_words().map(|w| w.load(Ordering::Relaxed));
        // SYNC: slot-identity. Keeps the word loads before the re-read of `id_gen`.
        fence(Ordering::Acquire);
        if self.id_gen.load(Ordering::Relaxed) != g1 {
            return Identity::default();
        }
        Identity {
            pid: pid_of(owner),
            unique: id_word(unique, generation, 0),
            pidns: id_word(pidns, generation, 1),
            boot: id_word(boot, generation, 2),
        }
    }

    /// Makes both halves non-live for `generation` with no bits; false if a half holds
    /// bits (of any generation).
    fn close_empty_halves(&self, generation: u32) -> bool {
        for half in [&self.lo, &self.hi] {
            let mut cur = half.load(Ordering::Acquire);
            loop {
                if half_bits(cur) != 0 {
                    return false;
                }
                if half_tag(cur) != live_tag(generation) {
                    // Already fenced (or an older generation's tag): closed. Still an RMW
                    // (writing the same value), so that a late live tag of `generation`'s
                    // registrant (`retag_live`, an RMW on this half) is ordered with it:
                    // if it comes after, its CAS reads from ours, so the registrant then
                    // sees the owner word as we left it (fenced, in pass 2) and marks
                    // nothing; if it came before, we see it here and close it.
                    // SYNC: half-close (AcqRel; pairs with `retag_live`'s CAS).
                    match half.compare_exchange(cur, cur, Ordering::AcqRel, Ordering::Acquire) {
                        Ok(_) => break,
                        Err(v) => {
                            cur = v;
                            continue;
                        }
                    }
                }
                match half.compare_exchange(
                    cur,
                    half_word(fenced_tag(generation), 0),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break,
                    Err(v) => {
                        cur = v;
                        spin_hint();
                    }
                }
            }
        }
        true
    }

    /// Records a beat at epoch `now` for the registration `expected`. False if the slot is
    /// no longer `expected` (fenced, unregistered or re-registered): the caller was
    /// declared dead and must not resume as if nothing happened.
    #[inline]
    pub(crate) fn beat(&self, expected: u64, now: u64) -> bool {
        // SYNC: owner-claim / fence. Acquire: pairs with the owner CAS of register and
        // of a fencing watchdog.
        if self.owner.load(Ordering::Acquire) != expected || !is_live(expected) {
            return false;
        }
        // Monotone per registration (fetch_max), so snapshots never see it go back.
        // A beat that raced with fencing lands on a fenced slot, where last_seen no
        // longer decides anything (fenced slots with bits are reported regardless).
        if self.last_seen.load(Ordering::Relaxed) < now {
            self.last_seen.fetch_max(now, Ordering::Release);
        }
        true
    }

    /// Sets (`set`) or clears in-flight `bit` for registration `expected`. False if the
    /// bit is out of range or the caller no longer owns the slot's bitmap.
    #[inline]
    pub(crate) fn update_bit(&self, expected: u64, bit: u8, set: bool) -> bool {
        if bit >= 64 || !is_live(expected) {
            return false;
        }
        if self.owner.load(Ordering::Acquire) != expected {
            return false; // fast rejection; the tag check below is the real fence
        }
        let (half, mask) = self.half(bit);
        let tag = tag_of(expected);
        let mut cur = half.load(Ordering::Acquire);
        loop {
            if half_tag(cur) != tag {
                return false;
            }
            let bits = half_bits(cur);
            let new_bits = if set { bits | mask } else { bits & !mask };
            if new_bits == bits {
                return true;
            }
            // SYNC: half-bits. AcqRel: the watchdog's collecting CAS (Acquire) sees
            // everything the worker did before marking.
            match half.compare_exchange(
                cur,
                half_word(tag, new_bits),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(v) => {
                    cur = v;
                    spin_hint();
                }
            }
        }
    }

    /// Unregisters `expected`: fences the slot, closes its halves, and frees it when no
    /// bits are left (bits left behind are reported by the next scan and reclaimed).
    /// False if the caller no longer owned the slot.
    pub(crate) fn release(&self, expected: u64) -> bool {
        if !is_live(expected)
            || self
                .owner
                .compare_exchange(
                    expected,
                    expected | FENCED_BIT,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_err()
        {
            return false;
        }
        let (_, left) = self.retag_fenced(gen_of(expected), 0);
        if left == 0 {
            let free = owner_word(0, gen_of(expected), true);
            // Losing this CAS means a register already reused the fenced slot: fine.
            let _ = self.owner.compare_exchange(
                expected | FENCED_BIT,
                free,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
        true
    }

    /// Retags both halves of `generation` to the fenced tag, removing the bits in `remove`.
    /// Returns `(removed, left)`. Halves of another generation are not touched.
    pub(crate) fn retag_fenced(&self, generation: u32, remove: u64) -> (u64, u64) {
        let mut removed = 0u64;
        let mut left = 0u64;
        for (shift, half) in [(0u32, &self.lo), (32u32, &self.hi)] {
            let mask = (remove >> shift) as u32;
            let mut cur = half.load(Ordering::Acquire);
            loop {
                if gen_of(u64::from(half_tag(cur))) != generation {
                    break; // re-registered meanwhile: not ours to touch
                }
                let bits = half_bits(cur);
                let new = half_word(fenced_tag(generation), bits & !mask);
                if new == cur {
                    left |= u64::from(bits) << shift;
                    break;
                }
                // SYNC: half-bits. AcqRel: see `update_bit`.
                match half.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        removed |= u64::from(bits & mask) << shift;
                        left |= u64::from(bits & !mask) << shift;
                        break;
                    }
                    Err(v) => {
                        cur = v;
                        spin_hint();
                    }
                }
            }
        }
        (removed, left)
    }

    /// Fences the registration a watchdog saw (`seen`, from its snapshot). Returns
    /// `Some(true)` if this call fenced it, `Some(false)` if `seen` was already a fenced
    /// word and the slot still holds it, `None` if the slot moved on (another watchdog
    /// fenced it first, or it was unregistered or re-registered).
    pub(crate) fn fence(&self, seen: u64) -> Option<bool> {
        if pid_of(seen) == 0 {
            return None;
        }
        if is_fenced(seen) {
            return (self.owner.load(Ordering::Acquire) == seen).then_some(false);
        }
        // SYNC: fence. AcqRel: pairs with the worker's Acquire owner load in beat/mark.
        self.owner
            .compare_exchange(seen, seen | FENCED_BIT, Ordering::AcqRel, Ordering::Acquire)
            .ok()
            .map(|_| true)
    }

    /// Reclaims the registration `seen`: fences it and takes every in-flight bit it still
    /// holds (including bits set after the snapshot). `None` if the slot moved on. Each
    /// bit is returned by exactly one call.
    pub(crate) fn reclaim(&self, seen: u64) -> Option<(u64, bool)> {
        let newly = self.fence(seen)?;
        Some((self.retag_fenced(gen_of(seen), u64::MAX).0, newly))
    }

    /// Fences the registration `seen` and erases only the `reported` bits; bits set after
    /// the snapshot stay (and are reported again by the next scan). `None` if the slot
    /// moved on.
    pub(crate) fn clear_reported(&self, seen: u64, reported: u64) -> Option<(u64, bool)> {
        let newly = self.fence(seen)?;
        Some((self.retag_fenced(gen_of(seen), reported).0, newly))
    }

    /// A consistent snapshot (H1): the owner word is read before and after the other
    /// fields and the read is retried while it changes, at most [`SNAPSHOT_RETRIES`]
    /// times (no waiting on any writer, so a crashed process cannot stall it). `None`
    /// after that many changes in a row.
    pub(crate) fn read(&self) -> Option<HeartbeatSnapshot> {
        for _ in 0..SNAPSHOT_RETRIES {
            // SYNC: owner-claim / half-retag. The first owner load and the half loads are
            // Acquire (a new registration's owner word or live tag brings its last_seen
            // and identity along); the Acquire fence keeps every field load before the
            // re-read of the owner word.
            let o1 = self.owner.load(Ordering::Acquire);
            let lo = self.lo.load(Ordering::Acquire);
            let hi = self.hi.load(Ordering::Acquire);
            let last_seen = self.last_seen.load(Ordering::Relaxed);
            let identity = self.identity(o1);
            fence(Ordering::Acquire);
            let o2 = self.owner.load(Ordering::Relaxed);
            if o1 == o2 {
                return Some(HeartbeatSnapshot::build(o1, lo, hi, last_seen, identity));
            }
            spin_hint();
        }
        None
    }
}

/// A word a worker may act with: registered and not fenced.
#[inline]
fn is_live(owner: u64) -> bool {
    pid_of(owner) != 0 && !is_fenced(owner)
}
