//! A helper thread that turns a holder's death into a futex wake-up, so a blocked
//! `acquire` can sleep long (burning almost no CPU) and still take over within
//! microseconds of the holder's death.
//!
//! The thread opens a pidfd for the holder, verifies the recorded identity after opening
//! it (so the fd names the right process even under pid reuse), and
//! `poll`s the pidfd together with an eventfd the waiter uses to stop it. When the pidfd
//! becomes readable (the process exited; zombies included) and the watched claim is still
//! current, it bumps the lease's `wake` word and wakes every sleeper.

use std::os::fd::OwnedFd;
use std::thread::{Scope, ScopedJoinHandle};

use super::os::{Identity, Liveness, PidWatch, liveness};
use super::state::LeaseState;

/// A running watcher of one holder.
pub(crate) struct DeathWatcher<'scope> {
    /// The claim id (holder + generation bits) whose holder is watched.
    pub(crate) id: u64,
    stop: OwnedFd,
    handle: ScopedJoinHandle<'scope, ()>,
}

impl<'scope> DeathWatcher<'scope> {
    /// Starts watching process `pid` (started at `start`) for the claim `id`; `None` if
    /// no watcher could be started (the caller then polls).
    pub(crate) fn spawn<'env>(
        scope: &'scope Scope<'scope, 'env>,
        state: &'env LeaseState,
        id: u64,
        ident: Identity,
    ) -> Option<Self> {
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (scope, state, id, ident);
            return None;
        }
        #[cfg(target_os = "linux")]
        Self::spawn_linux(scope, state, id, ident)
    }

    #[cfg(target_os = "linux")]
    fn spawn_linux<'env>(
        scope: &'scope Scope<'scope, 'env>,
        state: &'env LeaseState,
        id: u64,
        ident: Identity,
    ) -> Option<Self> {
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
        let handle = std::thread::Builder::new()
            .name("cxc-lease-watch".into())
            .spawn_scoped(scope, move || {
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
                // The holder is gone: wake every sleeper so one takes over at once. Only if
                // its claim is still current: a holder that released before it exited
                // already woke a sleeper, and waking all of them again (each with its own
                // watcher) would only crowd the CPUs while the next holder starts.
                if state.word().id() == id {
                    crate::park::wake_all(&state.wake);
                }
            })
            .ok()?;
        Some(DeathWatcher { id, stop, handle })
    }

    /// Stops the watcher and waits for it.
    pub(crate) fn stop(self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        let _ = self.handle.join();
    }
}
