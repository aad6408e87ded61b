//! The holder-table registration the semaphore and the rwlock share: a handle's cached
//! slot (keyed by the process's lineage token) and the find-or-claim step.

use std::sync::atomic::{AtomicU64, Ordering};

use cxc_mmf::identity::{Identity, Liveness, PidLookup, liveness, lookup_pid};

use crate::semaphore::word::{
    STATE_ACTIVE, STATE_RECLAIMING, TAG_FALLBACK, identity_tag, owner_parts,
};

/// Serialises registration within this process, so two handles of one file never claim
/// two slots for the same process. Held only on the once-per-handle slow path.
/// Serialises registration within this process; fork-safe (see `forklock.rs`).
static REGISTRY: crate::forklock::ForkSafeLock = crate::forklock::ForkSafeLock::new();

/// A handle's holder slot, cached: `(proc << 32) | (slot + 1)`, 0 = not yet looked up.
/// Keyed by the lineage token `proc` ([`cxc_mmf::identity::current_proc`]), so a child
/// made by `fork` looks its own slot up.
#[derive(Debug, Default)]
pub(crate) struct HolderCache(AtomicU64);

impl HolderCache {
    /// Nothing cached.
    pub(crate) const fn new() -> Self {
        HolderCache(AtomicU64::new(0))
    }

    /// The slot cached for the process whose lineage token
    /// ([`cxc_mmf::identity::current_proc`]) is `proc`.
    #[inline]
    pub(crate) fn get(&self, proc: u32) -> Option<usize> {
        let cached = self.0.load(Ordering::Acquire);
        ((cached >> 32) as u32 == proc && cached as u32 != 0).then(|| cached as u32 as usize - 1)
    }

    /// This process's slot, registering it with `register` (serialised within the
    /// process) unless another thread did while this one waited; cached. Fails (and is
    /// tried again on the next use) while this process's identity cannot be read whole
    /// (out of descriptors): a slot recorded with a partial identity could never be
    /// reclaimed. `path` is the file's, for that error.
    #[cold]
    pub(crate) fn register<E: From<cxc_mmf::MmfError>>(
        &self,
        path: &std::path::Path,
        register: impl FnOnce(&Identity) -> Result<usize, E>,
    ) -> Result<usize, E> {
        let me = cxc_mmf::identity::identify_for(path)?;
        let proc = cxc_mmf::identity::current_proc();
        let _guard = REGISTRY.lock();
        if let Some(slot) = self.get(proc) {
            return Ok(slot);
        }
        let slot = register(&me)?;
        // SYNC: holder cache (Release; pairs with the Acquire in `get`).
        self.0.store(
            (u64::from(proc) << 32) | (slot as u64 + 1),
            Ordering::Release,
        );
        Ok(slot)
    }
}

/// A process's slot in a holder table: `found` (its own, registered before), or a free
/// one `claim_free` takes, after `reclaim` of dead holders if none is free. `counted` is
/// told whether a slot was claimed (`false`: the table is full of live processes).
pub(crate) fn find_or_claim(
    found: Option<usize>,
    claim_free: impl Fn() -> Option<usize>,
    reclaim: impl FnOnce(),
    counted: impl FnOnce(bool),
) -> Option<usize> {
    found.or_else(|| {
        let claimed = claim_free().or_else(|| {
            reclaim();
            claim_free()
        });
        counted(claimed.is_some());
        claimed
    })
}

/// Whether the process named by `pid` and identity tag `tag` (an owner word's, see
/// `semaphore::word`) is gone: no process has the pid now, the process that has it has
/// another identity (pid reuse), or its whole thread group exited. An unknown identity
/// (tag 0) or an OS that cannot tell counts as alive: never reclaim on a guess.
pub(crate) fn is_dead(pid: u32, tag: u32) -> bool {
    if pid == 0 || tag == 0 {
        return false;
    }
    match lookup_pid(pid, tag & TAG_FALLBACK != 0) {
        PidLookup::NoProcess => true,
        PidLookup::Unknown => false,
        PidLookup::Found(id) if identity_tag(&id) == tag => liveness(&id) == Liveness::Dead,
        // Another process has the pid now, unless a fallback start time one tick away
        // is the same process seen through a time namespace whose boot clock offset is
        // not a whole tick (`/proc` rounds the shifted time): cannot tell then.
        PidLookup::Found(id) => !(id.is_fallback() && tag_one_tick_away(&id, tag)),
    }
}

/// Whether `tag` is the tag of the fallback identity `id` with a start time one tick
/// earlier or later.
fn tag_one_tick_away(id: &Identity, tag: u32) -> bool {
    use cxc_mmf::identity::FALLBACK_BIT;
    let start = id.unique & !FALLBACK_BIT;
    [start.wrapping_sub(1), start.wrapping_add(1)]
        .into_iter()
        .filter(|&s| s != 0 && s & FALLBACK_BIT == 0)
        .any(|s| {
            identity_tag(&Identity {
                unique: FALLBACK_BIT | s,
                ..*id
            }) == tag
        })
}

/// Whether this process (pid `me`, identity tag `my_tag`) may take over the holder slot
/// whose owner word is `seen`: registered or being reclaimed, by another process, which
/// is dead ([`is_dead`]).
pub(crate) fn reclaimable(seen: u64, me: u32, my_tag: u32) -> bool {
    let (state, pid, tag) = owner_parts(seen);
    (state == STATE_ACTIVE || state == STATE_RECLAIMING)
        && !(pid == me && tag == my_tag)
        && is_dead(pid, tag)
}

/// The id (nsfs inode) of this process's pid namespace, as its identity records it; 0 if
/// unknown. Pids and `/proc` only mean the same thing to processes in one namespace.
pub(crate) fn pid_namespace() -> u64 {
    Identity::current().pidns
}

/// `Err((file_ns, mine))` if this process is in another pid namespace (`mine`) than the
/// file's creator (`file_ns`), so neither can check the other's pids; a namespace
/// unknown on either side is not a mismatch.
pub(crate) fn check_namespace(file_ns: u64) -> Result<(), (u64, u64)> {
    check_namespace_of(file_ns, pid_namespace())
}

/// Whether this process (its cached identity) is in another pid namespace than the
/// file's creator (`file_ns`): a handle opened in the file's namespace and carried into
/// another by `unshare` + `fork` must not judge the file's holders (their pids name
/// nothing, or other processes, here), nor register.
pub(crate) fn foreign_namespace(file_ns: u64) -> bool {
    check_namespace_of(file_ns, Identity::current().pidns).is_err()
}

fn check_namespace_of(file_ns: u64, mine: u64) -> Result<(), (u64, u64)> {
    if file_ns != 0 && mine != 0 && file_ns != mine {
        return Err((file_ns, mine));
    }
    Ok(())
}
