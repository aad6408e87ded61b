//! A helper thread that turns a holder's death into a futex wake-up, so a blocked
//! `acquire` can sleep long (burning almost no CPU) and still take over within
//! microseconds of the holder's death.
//!
//! The thread opens a pidfd for the holder, verifies the recorded identity after opening
//! it (so the fd names the right process even under pid reuse), and
//! `poll`s the pidfd together with an eventfd the waiter uses to stop it. When the pidfd
//! becomes readable (the process exited; zombies included) and the watched claim is still
//! current, it bumps the lease's `wake` word and wakes every sleeper.
//!
//! A waiter that is done with its watcher (it got the lease, timed out, or the holder
//! changed) tells it to stop and returns at once: the thread is joined later by the
//! handle ([`Retired`]: at the next blocked wait, or when the handle drops). Joining it on
//! the spot cost the woken waiter about 40 µs on the 2-core test machine (the thread has to
//! be scheduled, leave `poll`, close its fds and exit), and that was most of the wake-up
//! latency of a waiter that had slept past its first nap.

use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::thread::JoinHandle;

use super::os::{Identity, Liveness, PidWatch, liveness};
use super::state::LeaseState;

/// The lease state a watcher thread reads and wakes, as an address the thread can carry.
struct StatePtr(*const LeaseState);

// SAFETY: the pointer is only dereferenced as a shared `&LeaseState` (all atomics, shared
// between threads and processes by design), and only while the mapping it points into is
// mapped: every watcher thread is joined before its handle's mapping is unmapped (see
// `DeathWatcher` and `Retired`).
unsafe impl Send for StatePtr {}

/// A running watcher of one holder. Dropping it stops and joins the thread; `retire`
/// stops it and leaves the join to the handle's [`Retired`].
pub(crate) struct DeathWatcher {
    /// The claim id (holder + generation bits) whose holder is watched.
    pub(crate) id: u64,
    stop: OwnedFd,
    handle: Option<JoinHandle<()>>,
}

impl DeathWatcher {
    /// Starts watching the process `ident` for the claim `id` of `state`; `None` if no
    /// watcher could be started (the caller then polls).
    ///
    /// `state` must be the state in the mapping of the handle that owns `retired` where
    /// this watcher ends up (or the watcher must be dropped before that mapping goes): the
    /// thread reads it until it is joined.
    pub(crate) fn spawn(state: &LeaseState, id: u64, ident: Identity) -> Option<Self> {
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (state, id, ident);
            return None;
        }
        #[cfg(target_os = "linux")]
        Self::spawn_linux(state, id, ident)
    }

    #[cfg(target_os = "linux")]
    fn spawn_linux(state: &LeaseState, id: u64, ident: Identity) -> Option<Self> {
        use rustix::event::{EventfdFlags, eventfd};
        // Opened, then verified against the identity (so it names the right process even
        // under pid reuse); `None` when the process is gone or cannot be watched.
        let pidfd = PidWatch::open(&ident);
        let dead = match &pidfd {
            Some(w) => w.is_dead(),
            None => liveness(&ident) == Liveness::Dead,
        };
        if pidfd.is_none() && !dead {
            return None;
        }
        let stop = eventfd(0, EventfdFlags::CLOEXEC).ok()?;
        let stop_r = stop.try_clone().ok()?;
        let ptr = StatePtr(state);
        let handle = std::thread::Builder::new()
            .name("cxc-lease-watch".into())
            .spawn(move || {
                let ptr = ptr;
                if !dead {
                    let Some(pidfd) = pidfd else { return };
                    use rustix::event::{PollFd, PollFlags, poll};
                    let fd = pidfd.as_fd();
                    let mut fds = [
                        PollFd::new(&fd, PollFlags::IN),
                        PollFd::new(&stop_r, PollFlags::IN),
                    ];
                    loop {
                        match poll(&mut fds, None) {
                            Ok(_) => break,
                            Err(rustix::io::Errno::INTR) => continue,
                            Err(_) => return,
                        }
                    }
                    if !fds[0].revents().contains(PollFlags::IN) {
                        return; // stopped by the waiter
                    }
                }
                // SAFETY: the thread is joined before the mapping behind `ptr` is
                // unmapped (`DeathWatcher::drop`, or the owning handle's `Retired`), so
                // the state is still mapped here.
                let state = unsafe { &*ptr.0 };
                // The holder is gone: wake every sleeper so one takes over at once. Only if
                // its claim is still current: a holder that released before it exited
                // already woke a sleeper, and waking all of them again (each with its own
                // watcher) would only crowd the CPUs while the next holder starts.
                if state.word().id() == id {
                    crate::park::wake_all(&state.wake);
                }
            })
            .ok()?;
        Some(DeathWatcher {
            id,
            stop,
            handle: Some(handle),
        })
    }

    /// Tells the thread to stop (it leaves its `poll` and exits).
    fn signal_stop(&self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
    }

    /// Stops the watcher without waiting for its thread, which `retired` (the handle's)
    /// joins later.
    pub(crate) fn retire(mut self, retired: &Retired) {
        self.signal_stop();
        if let Some(h) = self.handle.take() {
            retired.push(h);
        }
    }
}

impl Drop for DeathWatcher {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.signal_stop();
            let _ = h.join();
        }
    }
}

/// Watcher threads told to stop but not yet joined, with the pid of the process that
/// started them. Owned by a lease handle, which joins them before its mapping goes.
#[derive(Default)]
pub(crate) struct Retired(Mutex<(u32, Vec<JoinHandle<()>>)>);

impl std::fmt::Debug for Retired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Retired")
    }
}

impl Retired {
    /// Adds a stopped watcher's thread, and joins those that have already exited.
    fn push(&self, h: JoinHandle<()>) {
        let me = cxc_mmf::identity::current_pid();
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if g.0 != me {
            // A forked child's copy: those threads are the parent's and do not exist here
            // (joining one would wait forever); forget them.
            std::mem::forget(std::mem::take(&mut g.1));
            g.0 = me;
        }
        let mut i = 0;
        while i < g.1.len() {
            if g.1[i].is_finished() {
                let _ = g.1.swap_remove(i).join();
            } else {
                i += 1;
            }
        }
        g.1.push(h);
    }

    /// Joins every thread (the handle is dropping; they were all told to stop).
    pub(crate) fn join_all(&mut self) {
        let me = cxc_mmf::identity::current_pid();
        let g = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        let handles = std::mem::take(&mut g.1);
        if g.0 == me {
            for h in handles {
                let _ = h.join();
            }
        } else {
            std::mem::forget(handles);
        }
    }
}
