//! This process's holder slot (cached per handle, keyed by pid) and reclaim of dead
//! holders.

use std::sync::Mutex;
use std::sync::atomic::Ordering;

use super::error::SemaphoreError;
use super::handle::{SharedSemaphore, pid_namespace};
use super::layout::ctr;
use super::word::{BookWord, STATE_ACTIVE, STATE_RECLAIMING, owner_parts, owner_word, start_tag};
use crate::liveness::{self, ProcStatus, proc_status};

/// Low half of the holder cache meaning "registration failed: run untracked".
const UNTRACKED: u32 = u32::MAX;

/// Serialises registration within this process, so two handles of one file never claim
/// two slots for the same process. Held only on the once-per-handle slow path.
static REGISTRY: Mutex<()> = Mutex::new(());

impl SharedSemaphore {
    /// This process's holder slot: cached; looked up or registered on first use (and
    /// again in a forked child). `None` if the table is full: the process runs untracked.
    #[inline]
    pub(super) fn holder(&self) -> Option<usize> {
        let pid = liveness::current_pid();
        let cached = self.holder.load(Ordering::Acquire);
        if (cached >> 32) as u32 == pid && cached != 0 {
            return match cached as u32 {
                UNTRACKED => None,
                s => Some(s as usize - 1),
            };
        }
        self.holder_slow().ok()
    }

    /// Registers this process in the holder table now (it is otherwise done on first
    /// use), so that a full table is reported instead of silently running untracked.
    ///
    /// # Errors
    /// [`SemaphoreError::TableFull`] if every slot belongs to a live process;
    /// [`SemaphoreError::ForeignPidNamespace`] if this process is in another pid
    /// namespace than the file's creator.
    pub fn register(&self) -> Result<(), SemaphoreError> {
        if self.foreign {
            return Err(SemaphoreError::ForeignPidNamespace {
                expected: self.map.info().layout.params[2],
                found: pid_namespace(),
            });
        }
        match self.holder() {
            Some(_) => Ok(()),
            None => Err(SemaphoreError::TableFull {
                capacity: self.map.slots().len() as u32,
            }),
        }
    }

    #[cold]
    fn holder_slow(&self) -> Result<usize, ()> {
        let me = liveness::current();
        let _guard = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
        let cached = self.holder.load(Ordering::Acquire);
        let slot = if (cached >> 32) as u32 == me.pid && cached != 0 {
            // Another thread registered while we waited for the lock.
            match cached as u32 {
                UNTRACKED => None,
                s => Some(s as usize - 1),
            }
        } else {
            let raw = self.raw();
            let owner = owner_word(STATE_ACTIVE, me.pid, start_tag(me.start_time));
            let found = if self.foreign {
                raw.bump(ctr::UNTRACKED);
                None
            } else {
                raw.find_owner(owner).or_else(|| {
                    let claimed = raw.claim_free(owner).or_else(|| {
                        self.reclaim_scan(false);
                        raw.claim_free(owner)
                    });
                    raw.bump(if claimed.is_some() {
                        ctr::REGISTERED
                    } else {
                        ctr::UNTRACKED
                    });
                    claimed
                })
            };
            let low = found.map_or(UNTRACKED, |s| s as u32 + 1);
            // SYNC: holder cache (Release; pairs with the Acquire in `holder`).
            self.holder.store(
                (u64::from(me.pid) << 32) | u64::from(low),
                Ordering::Release,
            );
            found
        };
        slot.ok_or(())
    }

    /// Returns the permits of every holder whose process has died (pid gone, a zombie,
    /// or reused by a process with another start time) and frees their slots. Also
    /// finishes reclaims abandoned by reclaimers that died. Returns the number of
    /// permits returned to the pool. Does nothing in a process whose pid namespace is
    /// not the creator's (it cannot tell which pids are alive).
    pub fn reclaim_dead(&self) -> u32 {
        self.reclaim_noted(false)
    }

    /// [`reclaim_scan`](Self::reclaim_scan), recording what it returned.
    pub(super) fn reclaim_noted(&self, only_holding: bool) -> u32 {
        let n = self.reclaim_scan(only_holding);
        if n > 0 {
            self.note(cxc_sidecar::OpCode::SemReclaim, 0, u64::from(n));
        }
        n
    }

    /// The reclaim scan; `only_holding` skips dead holders that hold nothing (the
    /// blocked-acquirer variant, which only wants permits back).
    pub(super) fn reclaim_scan(&self, only_holding: bool) -> u32 {
        if self.foreign {
            return 0;
        }
        let raw = self.raw();
        raw.bump(ctr::RECLAIM_SCANS);
        let me = liveness::current();
        let my_tag = start_tag(me.start_time);
        let mut total = 0;
        for (d, slot) in raw.slots.iter().enumerate() {
            let seen = slot.owner.load(Ordering::Acquire);
            let (state, pid, tag) = owner_parts(seen);
            if state != STATE_ACTIVE && state != STATE_RECLAIMING {
                continue;
            }
            if only_holding
                && state == STATE_ACTIVE
                && BookWord(slot.book.load(Ordering::Acquire)).held() == 0
            {
                continue;
            }
            if (pid == me.pid && tag == my_tag) || !is_dead(pid, tag) {
                continue;
            }
            if !raw.take_over(d, seen, me.pid, my_tag) {
                continue;
            }
            let returned = raw.drain(d);
            raw.free(d, me.pid, my_tag);
            raw.add(ctr::RECLAIMED_PERMITS, u64::from(returned));
            raw.bump(ctr::RECLAIMED_HOLDERS);
            total += returned;
        }
        if total > 0 {
            raw.wake_sleepers(total);
        }
        total
    }
}

/// Whether the process `pid` whose start-time tag is `tag` is gone. An unknown start time
/// or an unreadable `/proc` counts as alive: never reclaim on a guess.
fn is_dead(pid: u32, tag: u32) -> bool {
    if pid == 0 || tag == 0 {
        return false;
    }
    match proc_status(pid) {
        ProcStatus::Live { start_time } => start_tag(start_time) != tag,
        // The main thread exited: dead only if the whole thread group is gone.
        ProcStatus::Zombie => match cxc_mmf::identity::proc_group_alive(pid) {
            Some(alive) => !alive,
            None => false,
        },
        ProcStatus::Gone => true,
        ProcStatus::Unknown => false,
    }
}
