//! A helper thread that turns a holder's death into a futex wake-up, so a blocked
//! `acquire` can sleep long (burning almost no CPU) and still take over within
//! microseconds of the holder's death.
//!
//! The thread opens a pidfd for the holder, verifies the recorded identity after opening
//! it (so the fd names the right process even under pid reuse), and
//! `poll`s the pidfd together with an eventfd the handle uses to stop it. When the pidfd
//! becomes readable (the process exited; zombies included) and that process still holds
//! the lease (the claim word's holder slot records its identity), it bumps the lease's
//! `wake` word and wakes every sleeper, then ends.
//!
//! One watcher per handle ([`Watch`]), kept after the wait that started it: a later wait
//! on the same holder process uses it again, and a waiter that got the lease, timed out or
//! saw the holder change returns without touching it. It ends when its process exits, or
//! when the handle stops it: to watch another process (at the start of a wait, never on
//! the way out of one), or when the handle drops. On the 2-core test machine a watcher per
//! wait, stopped as the woken waiter left, made up most of that waiter's wake-up latency:
//! the stop (an `eventfd` write) woke the thread on the other, idle CPU, an
//! inter-processor wake-up the writer paid for (about 14 µs in its `write`, kernel
//! trace), and joining the thread on the spot had cost about 40 µs before that.

use std::os::fd::OwnedFd;
use std::sync::Mutex;
use std::thread::JoinHandle;

use super::os::{Identity, Liveness, PidWatch, liveness};
use super::state::LeaseState;

/// The lease state a watcher thread reads and wakes, as an address the thread can carry.
struct StatePtr(*const LeaseState);

// SAFETY: the pointer is only dereferenced as a shared `&LeaseState` (all atomics, shared
// between threads and processes by design), and only while the mapping it points into is
// mapped: every watcher thread is stopped and joined in `Watch::join_all`, which the
// owning handle runs before its mapping is unmapped.
unsafe impl Send for StatePtr {}

/// A watcher thread, and the fd that tells it to stop.
struct Thread {
    stop: OwnedFd,
    handle: JoinHandle<()>,
}

impl Thread {
    /// Tells the thread to stop (it leaves its `poll` and exits); it may have ended.
    fn signal_stop(&self) {
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
    }
}

/// What a handle knows of its watcher threads.
#[derive(Default)]
struct Threads {
    /// The process these threads belong to (0 before the first): in a child made by
    /// `fork` the copies name threads that do not exist there.
    pid: u32,
    /// The current watcher and the identity it watches.
    current: Option<(Identity, Thread)>,
    /// Stopped watchers not yet joined.
    stopped: Vec<Thread>,
}

impl Threads {
    /// In a forked child, forgets the parent's threads: never joined (they do not exist
    /// here) nor written to (their stop fds are shared with the parent), only this
    /// process's copies of the fds closed.
    fn adopt(&mut self, me: u32) {
        if self.pid == me {
            return;
        }
        let current = self.current.take().map(|(_, t)| t);
        for t in current.into_iter().chain(std::mem::take(&mut self.stopped)) {
            drop(t.stop);
            std::mem::forget(t.handle);
        }
        self.pid = me;
    }
}

/// A lease handle's death watcher (see the module docs).
#[derive(Default)]
pub(crate) struct Watch(Mutex<Threads>);

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch")
    }
}

impl Watch {
    /// Whether a running watcher covers the process `ident` (no thread is started).
    pub(crate) fn covers(&self, ident: &Identity) -> bool {
        let g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.pid == cxc_mmf::identity::current_pid()
            && g.current
                .as_ref()
                .is_some_and(|(id, t)| id == ident && !t.handle.is_finished())
    }

    /// Makes sure a watcher covers the process `ident` of `state` (the state in this
    /// handle's mapping), stopping one that watches another process and starting one if
    /// needed. Returns whether one covers it (without one the caller polls more often).
    pub(crate) fn ensure(&self, state: &LeaseState, ident: Identity) -> bool {
        let me = cxc_mmf::identity::current_pid();
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.adopt(me);
        if let Some((id, t)) = &g.current
            && *id == ident
            && !t.handle.is_finished()
        {
            return true;
        }
        if let Some((_, t)) = g.current.take() {
            t.signal_stop();
            g.stopped.push(t);
        }
        // Join the stopped ones that have ended (the rest at the next call or in
        // `join_all`).
        let mut i = 0;
        while i < g.stopped.len() {
            if g.stopped[i].handle.is_finished() {
                let _ = g.stopped.swap_remove(i).handle.join();
            } else {
                i += 1;
            }
        }
        match spawn(state, ident) {
            Some(t) => {
                g.current = Some((ident, t));
                true
            }
            None => false,
        }
    }

    /// Stops and joins every thread (the handle is dropping; they read its mapping).
    pub(crate) fn join_all(&mut self) {
        let me = cxc_mmf::identity::current_pid();
        let g = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        g.adopt(me);
        let threads: Vec<Thread> = g
            .current
            .take()
            .map(|(_, t)| t)
            .into_iter()
            .chain(std::mem::take(&mut g.stopped))
            .collect();
        for t in &threads {
            t.signal_stop();
        }
        for t in threads {
            let _ = t.handle.join();
        }
    }
}

/// Starts watching the process `ident` for `state`; `None` if no watcher could be started
/// (the caller then polls). The thread reads `state` until it is joined, so `state` must
/// be in the mapping of the handle whose [`Watch`] keeps the thread.
fn spawn(state: &LeaseState, ident: Identity) -> Option<Thread> {
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (state, ident);
        return None;
    }
    #[cfg(target_os = "linux")]
    spawn_linux(state, ident)
}

#[cfg(target_os = "linux")]
fn spawn_linux(state: &LeaseState, ident: Identity) -> Option<Thread> {
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
                    return; // stopped by the handle
                }
            }
            // SAFETY: the thread is joined before the mapping behind `ptr` is unmapped
            // (`Watch::join_all`, run by the owning handle's drop), so the state is still
            // mapped here.
            let state = unsafe { &*ptr.0 };
            // The process is gone: wake every sleeper so one takes over at once. Only if
            // it still holds the lease: a holder that released before it exited already
            // woke a sleeper, and waking all of them again (each handle with its own
            // watcher) would only crowd the CPUs while the next holder starts.
            let cur = state.word();
            if !cur.is_vacant() && state.holder_identity(cur) == Some(ident) {
                crate::park::wake_all(&state.wake);
            }
        })
        .ok()?;
    Some(Thread { stop, handle })
}
