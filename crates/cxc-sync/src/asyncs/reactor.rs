//! One waiting thread per process for every async waiter, plus one death-watch thread.
//!
//! Async waiters of a primitive form a *group* keyed by the primitive's wake word (and a
//! tag, e.g. one claim for `lost()`); a group has a *check* (may a waiter make progress
//! now? — e.g. "the lease is vacant, stale, or its holder is dead"; if not, how long
//! until time alone could change that). The reactor thread, for every group with waiters
//! and none in flight, runs the parking protocol of `park.rs` on the group's behalf: it
//! sets the sleepers flag in the wake word ([`park::announce`]), runs the check (which
//! re-checks the state word with a read-modify-write), and either wakes the group's first
//! waiter (FIFO) or adds the word to one `futex_waitv` call over every group (at most
//! [`MAX_WORDS`]). The wait's timeout is the soonest moment a check asked to be run again
//! ([`Next::Within`]: a lease's heartbeat going stale, a poll of what no event announces),
//! and at most [`IDLE_MAX`], so idle waiters cost a few wake-ups a second, not one per
//! [`TICK`]. A release bumps the wake word (the flag is set), which ends the
//! `futex_waitv`. The death-watch thread waits in `epoll` on the pidfds of the holders
//! that checks found (one-shot) and kicks the reactor when one exits, so a crashed holder
//! is replaced at once.
//!
//! So 10,000 waiters on 100 files cost two threads; an idle group costs one check per
//! wake-up of the reactor. Past [`MAX_WORDS`] wake words the reactor still checks every
//! group, but groups beyond the limit are only looked at every [`TICK`] (25 ms) instead
//! of being woken at once by a release.
//!
//! A waiter is woken alone: it polls, and either makes progress (and leaves its group) or
//! re-arms. A waiter dropped while in flight hands the turn to the next one, or, if it
//! was the last of its group, on to the sleepers of other processes (`announce` + wake on
//! the word). A release wakes one sleeper of the word, which may be this reactor after
//! the group it slept for emptied: the reactor then hands that wake-up on the same way,
//! so no other process's waiter is left asleep with the lease or a permit free. A wake-up
//! lost for good (a waiter of another process killed between being woken and handing it
//! on) delays this process's waiters by at most [`IDLE_MAX`].
//!
//! Words are touched only while their mapping is known alive: a handle that goes away
//! first removes its words and every group on them ([`forget_words`], from its `Drop`,
//! under the registry lock), so a future leaked with `mem::forget` leaves at most an
//! inert group until then, never a dangling word or check.
//!
//! A child made by `fork` starts a reactor of its own on its first wait (see [`reactor`]):
//! the parent's threads do not exist there.
//!
//! When no thread can be started (`EAGAIN`: a pids cgroup or `RLIMIT_NPROC` at its
//! limit), nothing panics and no waiter is left to a reactor without a thread: each poll
//! tries to start the thread again, and until one starts the future does the reactor's
//! work itself ([`Waiting::arm`]): it announces, runs its group's check and sleeps on the
//! wake word for at most [`TICK`] (less if the check says so; a release ends the sleep),
//! then asks to be polled again. That blocks the executor's thread for up to a tick per
//! poll, but it is only a fallback. A death watch that cannot start is tried again every
//! second by the reactor thread; meanwhile the checks find dead holders by their periodic
//! polls (at least every [`IDLE_MAX`]), and the reactor thread looks for an orphaned
//! process (`cxc_mmf::orphan`) in its place.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

use rustix::thread::futex;

use crate::park;

/// Wake words the reactor sleeps on at once: `futex_waitv` takes at most 128 futexes, one
/// of which is the reactor's own bell.
pub const MAX_WORDS: usize = 127;
/// The re-check interval of conditions that only polling can see (a holder whose pidfd
/// cannot be opened, a `lost()` waiter, a rwlock's periodic checks), and of groups past
/// [`MAX_WORDS`], which no release wakes.
pub const TICK: Duration = Duration::from_millis(25);
/// The longest the reactor sleeps without a wake-up, whatever the checks say. Bounds how
/// long a wake-up lost for good (see the module documentation) delays a waiter, and how
/// late a check notices that the lease changed hands while the reactor slept (a release
/// wakes one sleeper, perhaps in another process; a preemption or a takeover none) and
/// the new holder, which no pidfd of the reactor watches yet, then died.
pub const IDLE_MAX: Duration = Duration::from_millis(100);
/// The shortest timed sleep, so that a check whose moment is due but not yet seen (clock
/// rounding) does not make the reactor spin.
const MIN_SLEEP: Duration = Duration::from_millis(1);
/// How often the reactor thread tries again to start a death watch that could not start.
const DEATHS_RETRY: Duration = Duration::from_secs(1);

/// States of the reactor thread ([`Reactor::thread`]).
const THREAD_NONE: u8 = 0;
const THREAD_STARTING: u8 = 1;
const THREAD_RUNNING: u8 = 2;

/// What a group's check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// The first waiter should poll again now.
    Now,
    /// Nothing to do until the wake word changes, the reactor is kicked (a watched
    /// holder died), or this long has passed (time alone may change the verdict then).
    Within(Duration),
    /// As `Within`, and also look when the `AtomicU32` at the address no longer holds the
    /// value: a lease holder's sentinel word, in the same mapping as the group's wake word
    /// (so valid as long as the group), which the kernel changes, waking a sleeper, when
    /// the holder's process starts to exit (docs/owner-lease.md, "The sentinel").
    WithinOr(Duration, usize, u32),
}

impl Next {
    /// `Now` if `ready`, else look again within one [`TICK`] (conditions only polling
    /// sees).
    pub(crate) fn ticking(ready: bool) -> Next {
        if ready { Next::Now } else { Next::Within(TICK) }
    }
}

/// A group's check (see [`Next`]). Called only by the reactor thread, with the registry
/// locked.
pub(crate) type Check = Box<dyn FnMut() -> Next + Send>;

/// A group: the waiters of one wake word (and tag).
struct Group {
    /// Address of the wake word (an `AtomicU32` in a mapping). Valid while the group
    /// exists: every waiter borrows (or owns) the handle whose mapping contains it, and
    /// leaves the group (in its `Drop`) before the borrow ends.
    word: usize,
    check: Check,
    waiters: Vec<(u64, Waker)>,
    in_flight: Option<u64>,
}

/// (wake word address, tag).
pub(crate) type Key = (usize, u64);

/// A waiter's place in a group.
#[derive(Debug)]
pub(crate) struct Ticket {
    key: Key,
    id: u64,
}

/// A future's place in the reactor: in no group, or in one (a [`Ticket`]). It leaves its
/// group when the future resolves ([`leave`](Self::leave)) or is dropped.
///
/// Without a reactor thread (none could be started), the future waits by itself instead
/// (see the module documentation): then it keeps its group's check here.
#[derive(Debug, Default)]
pub(crate) struct Waiting {
    ticket: Option<Ticket>,
    inline: Option<Inline>,
}

/// The state of a future that waits without the reactor thread: the group it would be
/// in, that group's check (behind a mutex only so the future stays `Sync`; only `&mut`
/// reaches it), and whether its last sleep ended with a change of the wake word (a
/// wake-up it must hand on if it is dropped before it polls again).
struct Inline {
    key: Key,
    check: Mutex<Check>,
    woken: bool,
}

impl std::fmt::Debug for Inline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inline")
            .field("key", &self.key)
            .field("woken", &self.woken)
            .finish_non_exhaustive()
    }
}

impl Inline {
    /// One round of the reactor's work for this future alone: announce on the wake word,
    /// run the check, and unless it says `Now`, sleep on the word (and on a holder's
    /// sentinel word if the check names one) for at most [`TICK`].
    fn wait(&mut self) {
        // SAFETY: `key.0` is the address of an `AtomicU32` wake word in the mapping of the
        // handle that the polling future borrows or owns, so it is mapped during the poll.
        let word = unsafe { &*(self.key.0 as *const AtomicU32) };
        let announced = park::announce(word);
        let check = self.check.get_mut().unwrap_or_else(|e| e.into_inner());
        let (nap, other) = match check() {
            Next::Now => {
                self.woken = false;
                return;
            }
            Next::Within(d) => (d, None),
            Next::WithinOr(d, addr, val) => (d, Some((addr, val))),
        };
        let nap = nap.min(TICK).max(MIN_SLEEP);
        match other {
            Some((addr, val)) => {
                // SAFETY: the check's extra word is in the same mapping as the wake word
                // (see `Next::WithinOr`).
                let other = unsafe { &*(addr as *const AtomicU32) };
                crate::futex::wait_either(word, announced, other, val, nap);
            }
            None => crate::futex::wait(word, announced, nap),
        }
        self.woken = word.load(Ordering::SeqCst) != announced;
    }
}

impl Waiting {
    /// In no group.
    pub(crate) const fn new() -> Self {
        Waiting {
            ticket: None,
            inline: None,
        }
    }

    /// Joins the group `key` (or stays in it) to be woken through `waker`; `make_check`
    /// builds the group's check if this creates the group (see [`Reactor::arm`]).
    ///
    /// If the reactor thread is not running and cannot be started now, waits one round
    /// here instead (at most [`TICK`], see the module documentation) and wakes `waker`
    /// itself, so the future is polled again (and tries to start the thread again).
    pub(crate) fn arm(&mut self, key: Key, waker: &Waker, make_check: impl FnOnce() -> Check) {
        let r = reactor();
        if r.ensure_thread() {
            self.inline = None;
            r.arm(&mut self.ticket, key, waker, make_check);
            return;
        }
        // Registered as live, so a drop of this future hands a wake-up on only while the
        // handle is there (as the reactor does, see `forget_words`).
        r.lock().live.insert(key.0);
        let inline = match &mut self.inline {
            Some(i) if i.key == key => i,
            slot => slot.insert(Inline {
                key,
                check: Mutex::new(make_check()),
                woken: false,
            }),
        };
        inline.wait();
        waker.wake_by_ref();
    }

    /// Leaves the group, if in one, having made progress.
    pub(crate) fn leave(&mut self) {
        self.inline = None;
        if let Some(t) = self.ticket.take() {
            reactor().disarm(t, true);
        }
    }

    /// Leaves the group, if in one, without having made progress (the future is being
    /// dropped): as the `Drop` of [`Waiting`] does.
    pub(crate) fn abandon(&mut self) {
        if let Some(i) = self.inline.take()
            && i.woken
            && let Some(r) = running()
        {
            // Woken, and dropped before it polled again: hand the wake-up on, as the
            // reactor does for a dropped waiter in flight. Only while the word's handle
            // is there (its `Drop` removes the word from `live` under this lock first).
            let g = r.lock();
            if g.live.contains(&i.key.0) {
                // SAFETY: in `live`, so its mapping is still mapped (see `Groups::live`).
                pass_on(unsafe { &*(i.key.0 as *const AtomicU32) });
            }
        }
        if let Some(t) = self.ticket.take() {
            reactor().disarm(t, false);
        }
    }

    /// Whether the future is in a group (or waits without the reactor thread).
    pub(crate) fn is_waiting(&self) -> bool {
        self.ticket.is_some() || self.inline.is_some()
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.abandon();
    }
}

#[derive(Default)]
struct Groups {
    map: HashMap<Key, Group>,
    next: u64,
    /// Wake words of live handles that armed a group (removed by [`forget_words`] before
    /// their mapping goes): the reactor touches a word outside a group only if it is here.
    live: std::collections::HashSet<usize>,
}

/// A handle whose mapping holds the wake words `words` is going away: removes them and
/// every group keyed on them (waiters of futures leaked with `mem::forget` included), so
/// the reactor never touches the mapping again. Call from the handle's `Drop`, before the
/// mapping is unmapped.
pub(crate) fn forget_words(words: &[usize]) {
    if let Some(r) = running() {
        let mut g = r.lock();
        for w in words {
            g.live.remove(w);
        }
        g.map.retain(|k, _| !words.contains(&k.0));
    }
}

pub(crate) struct Reactor {
    /// The process whose reactor this is (its threads exist only there).
    pid: u32,
    groups: Mutex<Groups>,
    /// The reactor's own futex word (process-private): bumped to make it look again.
    bell: AtomicU32,
    /// Wake-ups of the death watch (a watched pidfd became readable), so a check that
    /// watches many holders polls their pidfds only after one.
    deaths: AtomicU64,
    epoll: Option<std::os::fd::OwnedFd>,
    /// The reactor thread: `THREAD_NONE` (not started, or it could not be: tried again
    /// by the next waiter), `THREAD_STARTING` or `THREAD_RUNNING`.
    thread: AtomicU8,
}

/// This process's reactor, once started (never freed). A child made by `fork` inherits the
/// pointer but not the threads (nor, safely, the lock, which a parent thread may have held
/// at the fork): it starts a reactor of its own, see [`reactor`].
static REACTOR: AtomicPtr<Reactor> = AtomicPtr::new(std::ptr::null_mut());

/// This process's reactor, if it has started one.
pub(crate) fn running() -> Option<&'static Reactor> {
    let p = REACTOR.load(Ordering::Acquire);
    // SAFETY: a non-null `REACTOR` points to a leaked `Reactor` (never freed), also in a
    // forked child (the memory is copied).
    let r = unsafe { p.as_ref() }?;
    (r.pid == cxc_mmf::identity::current_proc()).then_some(r)
}

/// The process's reactor, made on first use (and again in a child made by `fork`, whose
/// copy of the parent's has no threads). Its thread is started by the first waiter
/// ([`Reactor::ensure_thread`]), and by later ones for as long as it could not be.
pub(crate) fn reactor() -> &'static Reactor {
    match running() {
        Some(r) => r,
        None => start(),
    }
}

#[cold]
fn start() -> &'static Reactor {
    let me = cxc_mmf::identity::current_proc();
    loop {
        let old = REACTOR.load(Ordering::Acquire);
        // SAFETY: as in `running`.
        if let Some(r) = unsafe { old.as_ref() }
            && r.pid == me
        {
            return r;
        }
        let epoll = rustix::event::epoll::create(rustix::event::epoll::CreateFlags::CLOEXEC).ok();
        let new = Box::into_raw(Box::new(Reactor {
            pid: me,
            groups: Mutex::new(Groups::default()),
            bell: AtomicU32::new(0),
            deaths: AtomicU64::new(0),
            epoll,
            thread: AtomicU8::new(THREAD_NONE),
        }));
        // Lock-free publication (a lock could be held across `fork` by another thread);
        // the loser frees its unused reactor. No thread is started here: a published
        // reactor whose thread could not start is started again by a later waiter.
        if REACTOR
            .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // SAFETY: `new` was never published, so nothing else refers to it.
            drop(unsafe { Box::from_raw(new) });
            continue;
        }
        // SAFETY: published and never freed from now on.
        return unsafe { &*new };
    }
}

impl Reactor {
    fn lock(&self) -> std::sync::MutexGuard<'_, Groups> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the reactor thread runs: starts it if it does not (also after an earlier
    /// start failed, e.g. at a pids limit), and waits for a start under way on another
    /// thread. `false` if it cannot be started now; nothing was registered then.
    pub(crate) fn ensure_thread(&'static self) -> bool {
        loop {
            match self.thread.compare_exchange(
                THREAD_NONE,
                THREAD_STARTING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(THREAD_RUNNING) => return true,
                // Another thread of this process is starting it (a spawn is quick).
                Err(_) => std::thread::yield_now(),
            }
        }
        let r = self;
        let started = std::thread::Builder::new()
            .name("cxc-async-reactor".into())
            .spawn(move || {
                cxc_mmf::orphan::ours();
                r.run()
            })
            .is_ok();
        self.thread.store(
            if started { THREAD_RUNNING } else { THREAD_NONE },
            Ordering::Release,
        );
        started
    }

    /// Starts the death watch: on the lease's sentinel thread, which every process that
    /// claims has and which otherwise only sleeps, or on a thread of its own if there is
    /// none. Whether it runs.
    fn start_death_watch(&'static self) -> bool {
        let job: Box<dyn FnOnce() + Send> = Box::new(move || self.watch_deaths());
        match crate::lease::host_on_sentinel(job) {
            Ok(()) => true,
            Err(job) => std::thread::Builder::new()
                .name("cxc-async-deaths".into())
                .spawn(move || {
                    cxc_mmf::orphan::ours();
                    job()
                })
                .is_ok(),
        }
    }

    /// Makes the reactor look at every group again.
    pub(crate) fn kick(&self) {
        self.bell.fetch_add(1, Ordering::SeqCst);
        let _ = futex::wake(&self.bell, futex::Flags::PRIVATE, 1);
    }

    /// Registers (or re-arms) a waiter of group `key` on `word`: `ticket` is the waiter's
    /// place (created on first arm). `make_check` builds the group's check if the group
    /// is new.
    pub(crate) fn arm(
        &self,
        ticket: &mut Option<Ticket>,
        key: Key,
        waker: &Waker,
        make_check: impl FnOnce() -> Check,
    ) {
        {
            let mut g = self.lock();
            let id = match ticket {
                Some(t) => t.id,
                None => {
                    g.next += 1;
                    let id = g.next;
                    *ticket = Some(Ticket { key, id });
                    id
                }
            };
            g.live.insert(key.0);
            let group = g.map.entry(key).or_insert_with(|| Group {
                word: key.0,
                check: make_check(),
                waiters: Vec::new(),
                in_flight: None,
            });
            if group.in_flight == Some(id) {
                group.in_flight = None;
            }
            match group.waiters.iter_mut().find(|(w, _)| *w == id) {
                Some((_, wk)) => wk.clone_from(waker),
                None => group.waiters.push((id, waker.clone())),
            }
        }
        self.kick();
    }

    /// Removes a waiter: it made progress (`progressed`), or its future was dropped. A
    /// dropped waiter that was in flight hands the turn on: to the next waiter of its
    /// group, or, if it was the last, to the sleepers of other processes. A group that
    /// empties makes the reactor stop sleeping on its word.
    pub(crate) fn disarm(&self, ticket: Ticket, progressed: bool) {
        let kick = {
            let mut g = self.lock();
            let Some(group) = g.map.get_mut(&ticket.key) else {
                return;
            };
            group.waiters.retain(|(w, _)| *w != ticket.id);
            let was_in_flight = group.in_flight == Some(ticket.id);
            if was_in_flight {
                group.in_flight = None;
            }
            let emptied = group.waiters.is_empty();
            if emptied {
                g.map.remove(&ticket.key);
                if was_in_flight && !progressed {
                    // SAFETY: the dropped waiter's future borrows (or owns) the handle
                    // whose mapping holds the word, so it is mapped now.
                    let word = unsafe { &*(ticket.key.0 as *const AtomicU32) };
                    pass_on(word);
                }
            }
            emptied || was_in_flight
        };
        if kick {
            self.kick();
        }
    }

    /// Waiters registered now, over every group (diagnostics and tests).
    pub(crate) fn waiters(&self) -> usize {
        self.lock().map.values().map(|g| g.waiters.len()).sum()
    }

    /// How many times the death watch saw a watched process exit (compare two reads: a
    /// change means some pidfd registered with [`watch_death`](Self::watch_death) became
    /// readable in between, or just before the first read).
    pub(crate) fn deaths(&self) -> u64 {
        self.deaths.load(Ordering::SeqCst)
    }

    /// Registers a holder's pidfd (one-shot) so its death kicks the reactor.
    pub(crate) fn watch_death(&self, fd: std::os::fd::BorrowedFd<'_>) {
        use rustix::event::epoll;
        if let Some(ep) = &self.epoll {
            let _ = epoll::add(
                ep,
                fd,
                epoll::EventData::new_u64(0),
                epoll::EventFlags::IN | epoll::EventFlags::ONESHOT,
            );
        }
    }

    fn watch_deaths(&self) {
        use rustix::event::epoll;
        let Some(ep) = &self.epoll else { return };
        let mut events = [epoll::Event {
            flags: epoll::EventFlags::empty(),
            data: epoll::EventData::new_u64(0),
        }; 16];
        // Not for ever: this thread also looks whether the application has any thread
        // left (`cxc_mmf::orphan`), as it may be the process's last.
        let mut next = cxc_mmf::orphan::LOOK_IDLE;
        loop {
            let timeout = rustix::time::Timespec {
                tv_sec: next.as_secs() as i64,
                tv_nsec: i64::from(next.subsec_nanos()),
            };
            match epoll::wait(ep, &mut events[..], Some(&timeout)) {
                Ok(0) => next = cxc_mmf::orphan::look(),
                Err(rustix::io::Errno::INTR) => {}
                Ok(_) => {
                    self.deaths.fetch_add(1, Ordering::SeqCst);
                    self.kick();
                }
                Err(_) => std::thread::sleep(TICK),
            }
        }
    }

    fn run(&'static self) {
        let mut waits: Vec<futex::Wait> = Vec::with_capacity(MAX_WORDS + 1);
        // (group, word, value announced) of every word in `waits` but the bell.
        let mut slept: Vec<(Key, usize, u32)> = Vec::with_capacity(MAX_WORDS);
        // The death watch (none without an epoll instance), and when to try to start it
        // again if it could not start. While it does not run, this thread looks for an
        // orphaned process in its place.
        let mut watching = false;
        let mut next_try = Instant::now();
        let mut looks = cxc_mmf::orphan::Looker::new();
        loop {
            if !watching && self.epoll.is_some() && Instant::now() >= next_try {
                watching = self.start_death_watch();
                next_try = Instant::now() + DEATHS_RETRY;
            }
            let bell = self.bell.load(Ordering::SeqCst);
            waits.clear();
            slept.clear();
            let mut nap = if watching {
                IDLE_MAX
            } else {
                IDLE_MAX.min(looks.tick())
            };
            let mut bell_wait = futex::Wait::new();
            bell_wait.val = u64::from(bell);
            bell_wait.uaddr = futex::WaitPtr::new(self.bell.as_ptr().cast());
            bell_wait.flags = futex::WaitFlags::SIZE_U32 | futex::WaitFlags::PRIVATE;
            waits.push(bell_wait);
            {
                let mut g = self.lock();
                for (key, group) in g.map.iter_mut() {
                    if group.in_flight.is_some() || group.waiters.is_empty() {
                        continue;
                    }
                    // SAFETY: `group.word` is the address of an `AtomicU32` wake word in a
                    // mapping that stays mapped while the group exists (see `Group::word`),
                    // and we hold the registry lock, so the group cannot go away now.
                    let word = unsafe { &*(group.word as *const AtomicU32) };
                    let announced = park::announce(word);
                    let shared_wait = |addr: usize, val: u32| {
                        let mut w = futex::Wait::new();
                        w.val = u64::from(val);
                        w.uaddr = futex::WaitPtr::new(addr as *mut core::ffi::c_void);
                        // Shared (not PRIVATE): the word lives in a MAP_SHARED mapping.
                        w.flags = futex::WaitFlags::SIZE_U32;
                        w
                    };
                    match (group.check)() {
                        Next::Now => {
                            let (id, waker) = &group.waiters[0];
                            group.in_flight = Some(*id);
                            waker.wake_by_ref();
                        }
                        next @ (Next::Within(d) | Next::WithinOr(d, ..))
                            if waits.len() <= MAX_WORDS =>
                        {
                            nap = nap.min(d);
                            waits.push(shared_wait(group.word, announced));
                            slept.push((*key, group.word, announced));
                            // The extra word only while there is room (else the holder's
                            // exit is seen at its pidfd, or by polling).
                            if let Next::WithinOr(_, addr, val) = next
                                && waits.len() <= MAX_WORDS
                            {
                                waits.push(shared_wait(addr, val));
                            }
                        }
                        // Past the limit no release wakes the group: look every tick.
                        Next::Within(d) | Next::WithinOr(d, ..) => nap = nap.min(d).min(TICK),
                    }
                }
            }
            let deadline = crate::futex::monotonic_after(nap.max(MIN_SLEEP));
            let _ = futex::waitv(
                &waits,
                futex::WaitvFlags::empty(),
                Some(&deadline),
                rustix::time::ClockId::Monotonic,
            );
            // A wake-up of a word whose group emptied while we slept was meant for another
            // process's sleeper: hand it on (the word changed; its group is gone).
            let g = self.lock();
            for &(key, addr, announced) in &slept {
                if g.map.contains_key(&key) || !g.live.contains(&addr) {
                    continue;
                }
                // SAFETY: `addr` is in `live`: its handle has not gone (its `Drop` removes
                // it under the registry lock, which we hold, before unmapping).
                let word = unsafe { &*(addr as *const AtomicU32) };
                if word.load(Ordering::SeqCst) != announced {
                    pass_on(word);
                }
            }
        }
    }
}

/// Hands a wake-up on to the next sleeper of `word`, in any process: sets the sleepers
/// flag (a wake-up cleared it) and wakes one.
fn pass_on(word: &AtomicU32) {
    park::announce(word);
    park::wake(word, 1, None);
}
