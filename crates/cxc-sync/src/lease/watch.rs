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
//! saw the holder change returns without waking it (it only updates two atomics). The
//! thread ends when its process exits, when it finds itself idle (no wait has used it for
//! [`IDLE`]; it looks every [`IDLE`], so it lives up to twice that unused), or when the
//! handle stops it: to watch another process (at the start of a
//! wait, never on the way out of one), or when the handle drops. On the 2-core test
//! machine a watcher per wait, stopped as the woken waiter left, made up most of that
//! waiter's wake-up latency: the stop (an `eventfd` write) woke the thread on the other,
//! idle CPU, an inter-processor wake-up the writer paid for (about 14 µs in its `write`,
//! kernel trace), and joining the thread on the spot had cost about 40 µs before that.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::os::{Identity, Liveness, PidWatch, liveness};
use super::state::LeaseState;

/// The lease state a watcher thread reads and wakes, as an address the thread can carry.
struct StatePtr(*const LeaseState);

// SAFETY: the pointer is only dereferenced as a shared `&LeaseState` (all atomics, shared
// between threads and processes by design), and only while the mapping it points into is
// mapped: every watcher thread is stopped and joined in `Watch::join_all`, which the
// owning handle runs before its mapping is unmapped.
unsafe impl Send for StatePtr {}

/// How long a watcher that no wait uses lives on: a later wait on the same process
/// within it needs no new thread; a handle that stopped waiting keeps no thread for long.
pub(crate) const IDLE: Duration = Duration::from_secs(1);

/// The waits that use a watcher, shared with its thread.
struct Users {
    /// The number of waits using the watcher (low 32 bits), and [`EXITING`]: the thread
    /// is ending and takes no new wait.
    count: AtomicU64,
    /// When the last wait stopped using it (ms since `base`).
    last_left: AtomicU64,
    base: Instant,
}

/// In [`Users::count`]: the thread is ending.
const EXITING: u64 = 1 << 32;

impl Users {
    /// One user from the start (the wait that starts the thread).
    fn new() -> Self {
        Users {
            count: AtomicU64::new(1),
            last_left: AtomicU64::new(0),
            base: Instant::now(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// Counts one more wait, unless the thread is ending.
    fn enter(&self) -> bool {
        let mut c = self.count.load(Ordering::Acquire);
        loop {
            if c & EXITING != 0 {
                return false;
            }
            match self
                .count
                .compare_exchange_weak(c, c + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(now) => c = now,
            }
        }
    }

    /// One wait stopped using the watcher.
    fn leave(&self) {
        self.last_left.store(self.now_ms(), Ordering::Relaxed);
        // Release: the thread that sees the count drop also sees `last_left`.
        self.count.fetch_sub(1, Ordering::Release);
    }

    /// The thread's decision to end after an idle poll: no wait uses it, none has for
    /// [`IDLE`], and no wait can start using it any more (the count goes from 0 to
    /// [`EXITING`] in one step, so `enter` either came first and keeps it, or fails).
    fn retire_if_idle(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
            && self
                .now_ms()
                .saturating_sub(self.last_left.load(Ordering::Relaxed))
                >= IDLE.as_millis() as u64
            && self
                .count
                .compare_exchange(0, EXITING, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }
}

/// A wait's use of the handle's watcher: while it lives, the watcher does not end for
/// being idle. Dropping it is two atomic updates (no system call).
pub(crate) struct Cover {
    ident: Identity,
    users: Arc<Users>,
}

impl Cover {
    /// The process the watcher watches.
    pub(crate) fn ident(&self) -> &Identity {
        &self.ident
    }

    /// Whether the watcher still runs: not stopped by its handle (to watch another
    /// process, for another wait) and not ended (its process exited). A wait whose
    /// watcher stopped needs another.
    pub(crate) fn live(&self) -> bool {
        self.users.count.load(Ordering::Acquire) & EXITING == 0
    }
}

impl Drop for Cover {
    fn drop(&mut self) {
        self.users.leave();
    }
}

/// A watcher thread, the fd that tells it to stop, and its users.
struct Thread {
    stop: OwnedFd,
    handle: JoinHandle<()>,
    users: Arc<Users>,
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
    /// The current watcher and the identity it watches.
    current: Option<(Identity, Thread)>,
    /// Stopped watchers not yet joined.
    stopped: Vec<Thread>,
}

/// A lease handle's death watcher (see the module docs).
pub(crate) struct Watch {
    /// The process that made the handle. In a child made by `fork` the copy is never used:
    /// its threads do not exist there, and its lock may have been copied while another
    /// thread of the parent held it (locking it would wait forever), so the child's waits
    /// poll instead.
    pid: u32,
    threads: Mutex<Threads>,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            pid: cxc_mmf::identity::current_proc(),
            threads: Mutex::default(),
        }
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watch")
    }
}

impl Watch {
    /// A use of a watcher of the process `ident` of `state` (the state in this handle's
    /// mapping): the running one if it watches `ident`; else, with `start`, a new one
    /// (stopping one that watches another process). `None` if there is none (the caller
    /// polls more often).
    pub(crate) fn cover(&self, state: &LeaseState, ident: Identity, start: bool) -> Option<Cover> {
        if cxc_mmf::identity::current_proc() != self.pid {
            return None;
        }
        let mut g = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((id, t)) = &g.current
            && *id == ident
            && !t.handle.is_finished()
            && t.users.enter()
        {
            return Some(Cover {
                ident,
                users: t.users.clone(),
            });
        }
        if !start {
            return None;
        }
        if let Some((_, t)) = g.current.take() {
            // Waits still using it see it stopped (`Cover::live`) and move on.
            t.users.count.fetch_or(EXITING, Ordering::AcqRel);
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
        let t = spawn(state, ident)?;
        let cover = Cover {
            ident,
            users: t.users.clone(),
        };
        g.current = Some((ident, t));
        Some(cover)
    }

    /// Stops and joins every thread (the handle is dropping; they read its mapping).
    pub(crate) fn join_all(&mut self) {
        let ours = cxc_mmf::identity::current_proc() == self.pid;
        let g = self.threads.get_mut().unwrap_or_else(|e| e.into_inner());
        let threads: Vec<Thread> = g
            .current
            .take()
            .map(|(_, t)| t)
            .into_iter()
            .chain(std::mem::take(&mut g.stopped))
            .collect();
        if !ours {
            // A forked child's copy: those threads are the parent's and do not exist here
            // (joining one would wait forever); forget them, and close this process's
            // copies of their stop fds without writing them (the parent's threads read
            // the same eventfds).
            for t in threads {
                drop(t.stop);
                std::mem::forget(t.handle);
            }
            return;
        }
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
    let users = Arc::new(Users::new());
    let users_t = users.clone();
    let ptr = StatePtr(state);
    let handle = std::thread::Builder::new()
        .name("cxc-lease-watch".into())
        .spawn(move || {
            cxc_mmf::orphan::ours();
            let ptr = ptr;
            if !dead {
                let Some(pidfd) = pidfd else { return };
                use rustix::event::{PollFd, PollFlags, poll};
                let fd = pidfd.as_fd();
                let mut fds = [
                    PollFd::new(&fd, PollFlags::IN),
                    PollFd::new(&stop_r, PollFlags::IN),
                ];
                let idle = rustix::time::Timespec {
                    tv_sec: IDLE.as_secs() as _,
                    tv_nsec: 0,
                };
                loop {
                    match poll(&mut fds, Some(&idle)) {
                        // Idle for a while: end unless a wait uses it.
                        Ok(0) if users_t.retire_if_idle() => return,
                        Ok(0) | Err(rustix::io::Errno::INTR) => continue,
                        Ok(_) => break,
                        Err(_) => {
                            users_t.count.fetch_or(EXITING, Ordering::AcqRel);
                            return;
                        }
                    }
                }
                if !fds[0].revents().contains(PollFlags::IN) {
                    users_t.count.fetch_or(EXITING, Ordering::AcqRel);
                    return; // stopped by the handle
                }
            }
            // The process is gone: the thread ends after the wake-up below, so no wait may
            // count on it any more.
            users_t.count.fetch_or(EXITING, Ordering::AcqRel);
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
    Some(Thread {
        stop,
        handle,
        users,
    })
}
