//! Wake latency of a waiter asleep in the kernel.
//!
//! The parent holds the lock; a child process (the waiter) publishes its thread id and
//! round number in the shared page, then blocks in its lock call. The parent polls
//! `/proc/<pid>/task/<tid>/stat` until the waiter thread's state is `S` (asleep; every
//! other thread of the waiter process too), waits [`MARGIN`] more (far beyond the lease's
//! spin phase, so a lease waiter has stopped spinning and is parked on its futex), checks
//! again, takes a `CLOCK_MONOTONIC` timestamp and releases. The waiter takes a timestamp
//! the moment its lock call returns and publishes it; the sample is the waiter's timestamp
//! minus the parent's. Then the waiter releases, the parent locks again and the next round
//! starts.
//!
//! Each waiter process does one warm-up round (not measured), then the parent waits
//! [`SETTLE`] before the measured rounds, for every implementation alike. The measurement
//! is the steady state of a process that keeps its handle: a thread that an implementation
//! starts in its first wait (the lease's death watcher) is new to the scheduler, which
//! counts a new thread as a full load for its first ~100 ms; while it does, the next
//! wake-ups land on the other vCPU far more often (with one extra sleeping thread started
//! in the raw futex's waiter: 231–336 of 440 rounds on the releasing process's CPU
//! against 400–430 without it; after a 400 ms pause, 419–422).
//!
//! Every round also records where it ran: the parent's CPU when it releases and the
//! waiter's CPU when its lock call returns (both read outside the measured interval).
//! The `wake_same_cpu/<impl>` notes give the share of rounds woken on the releasing
//! process's CPU (a few µs on the machines we measured) rather than on the other, idle
//! one (a cross-CPU wake-up, tens of µs in a VM).
//!
//! - `lease`: the waiter blocks in `OwnerLease::acquire`; the parent releases with
//!   `release_claim` (as the handoff case does);
//! - `raw_futex`: the floor: the waiter `FUTEX_WAIT`s while a word of the shared page is
//!   0; the parent stores 1 and `FUTEX_WAKE`s one;
//! - `robust_pthread`, `flock`: the peers, as in the handoff case.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::locks::{LockKind, Locks};
use super::{
    Config, arg, arg_path, finish, note, page_in, row_ns, scratch, spawn, wait_flag, wanted,
};
use crate::baseline::{futex_wait, futex_wake};
use crate::clock::now_ns;
use crate::shm::{SharedPage, flag};

/// The lease's default spin budget (`DEFAULT_SPIN` of cxc-sync's parking module): how long
/// a blocked `acquire` spins before it sleeps in the kernel.
const LEASE_SPIN: Duration = Duration::from_micros(30);
/// How long the parent waits after first seeing the waiter asleep before it releases:
/// 2 ms beyond the lease's spin budget, so every implementation's waiter is asleep in the
/// kernel, not spinning.
const MARGIN: Duration = LEASE_SPIN.saturating_add(Duration::from_millis(2));

/// The pause after a waiter process's warm-up round, before its measured rounds (see the
/// module docs).
const SETTLE: Duration = Duration::from_millis(150);

/// Batches the samples are split into; the implementations take turns batch by batch
/// (a fresh waiter process per batch), so a burst of load on the shared machine hits all
/// of them alike. Many short batches, because a waiter process tends to keep the CPU
/// placement it starts with (woken on the holder's CPU, a few µs; on the other, idle
/// CPU, tens of µs on the machine we measured): with 5 batches the floor's median moved
/// between the two from run to run, with 40 each implementation meets both alike.
const BATCHES: usize = 40;

/// Flags of the shared page this case uses (beyond [`flag::PING`], the raw futex word).
/// The parent stores the round number: the lock is held again, the waiter may block.
const GO: usize = 4;
/// The waiter stores the round number just before its lock call.
const WAITING: usize = 5;
/// The waiter stores the round number after it has published its timestamp and released.
const DONE: usize = 6;
/// The waiter's thread id (published once).
const TID: usize = 7;
/// The CPU the waiter's lock call returned on, this round.
const WOKEN_CPU: usize = 8;
/// Counter holding the waiter's timestamp of the current round.
const T_WOKEN: usize = 1;

/// One implementation: a lock kind, or `None` for the raw futex.
type Impl = Option<LockKind>;

fn impl_name(i: Impl) -> &'static str {
    i.map_or("raw_futex", LockKind::name)
}

/// Parent side: every implementation, batches interleaved.
pub(crate) fn run(cfg: &Config) {
    note(
        "wake_margin",
        &format!(
            "{:.2} ms (2 ms beyond the lease's default spin budget of {} µs)",
            MARGIN.as_secs_f64() * 1e3,
            LEASE_SPIN.as_micros()
        ),
    );
    let impls: Vec<Impl> = [
        Some(LockKind::Lease),
        Some(LockKind::Robust),
        Some(LockKind::Flock),
        None,
    ]
    .into_iter()
    .filter(|i| wanted(&format!("wake/{}", impl_name(*i))))
    .collect();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); impls.len()];
    let per = cfg.wake_iters.div_ceil(BATCHES);
    note(
        "wake_batches",
        &format!("{BATCHES} batches of {per} rounds"),
    );
    note("wake_settle", &format!("{} ms", SETTLE.as_millis()));
    let mut same_cpu = vec![0usize; impls.len()];
    for _ in 0..BATCHES {
        for ((i, s), same) in impls
            .iter()
            .zip(samples.iter_mut())
            .zip(same_cpu.iter_mut())
        {
            for r in batch(*i, per) {
                s.push(r.ns);
                *same += usize::from(r.woken_cpu == r.holder_cpu);
            }
        }
    }
    for ((i, s), same) in impls.iter().zip(&samples).zip(&same_cpu) {
        note(
            &format!("wake_same_cpu/{}", impl_name(*i)),
            &format!(
                "{same} of {} rounds woken on the releasing process's CPU",
                s.len()
            ),
        );
        row_ns(&format!("wake/{}", impl_name(*i)), s);
    }
}

/// One measured round.
struct Round {
    /// Release to the waiter's lock call returning.
    ns: f64,
    /// The parent's CPU when it released.
    holder_cpu: u32,
    /// The waiter's CPU when its lock call returned.
    woken_cpu: u32,
}

/// The holder's side of one implementation.
enum Holder {
    Locks(Locks),
    Futex(SharedPage),
}

impl Holder {
    fn page(&self) -> &SharedPage {
        match self {
            Holder::Locks(l) => l.page(),
            Holder::Futex(p) => p,
        }
    }

    fn lock(&mut self) {
        match self {
            Holder::Locks(l) => l.lock(0),
            Holder::Futex(p) => p.flag(flag::PING).store(0, Ordering::Release),
        }
    }

    fn unlock(&mut self) {
        match self {
            Holder::Locks(l) => l.unlock(0),
            Holder::Futex(p) => {
                let w = p.flag(flag::PING);
                w.store(1, Ordering::Release);
                futex_wake(w, 1);
            }
        }
    }
}

/// One waiter process: a warm-up round, a pause, then `rounds` measured rounds.
fn batch(imp: Impl, rounds: usize) -> Vec<Round> {
    let dir = scratch();
    let mut holder = match imp {
        Some(k) => Holder::Locks(Locks::create(k, dir.path(), 1)),
        None => Holder::Futex(page_in(dir.path())),
    };
    holder.lock();
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let total = rounds + 1;
    let total_s = total.to_string();
    let child = spawn("wake-waiter", &[impl_name(imp), dir_s, &total_s]);
    let pid = child.id();
    let mut samples = Vec::with_capacity(rounds);
    for r in 1..=total as u32 {
        let page = holder.page();
        page.flag(GO).store(r, Ordering::Release);
        wait_flag(page, WAITING, r);
        let tid = page.flag(TID).load(Ordering::Acquire);
        wait_asleep(pid, tid);
        std::thread::sleep(MARGIN);
        wait_asleep(pid, tid);
        let holder_cpu = rustix::thread::sched_getcpu() as u32;
        let t0 = now_ns();
        holder.unlock();
        let page = holder.page();
        wait_flag(page, DONE, r);
        let t1 = page.counter(T_WOKEN).load(Ordering::Acquire);
        if r > 1 {
            samples.push(Round {
                ns: t1.saturating_sub(t0) as f64,
                holder_cpu,
                woken_cpu: page.flag(WOKEN_CPU).load(Ordering::Acquire),
            });
        }
        holder.lock();
        if r == 1 {
            std::thread::sleep(SETTLE);
        }
    }
    finish(child, "wake-waiter");
    samples
}

/// Polls `/proc/<pid>/task/<tid>/stat` until the waiter thread's state is `S`
/// (interruptible sleep), and every other thread of the waiter process too (so a
/// thread the lock call started is not still starting up); panics after 20 s.
fn wait_asleep(pid: u32, tid: u32) {
    let start = Instant::now();
    while !(task_asleep(pid, tid) && all_tasks_asleep(pid)) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the waiter (pid {pid}, thread {tid}) never fell asleep"
        );
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// Whether thread `tid` of process `pid` is in state `S` (`false` if it cannot be read).
fn task_asleep(pid: u32, tid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
        .is_ok_and(|stat| thread_state(&stat) == Some('S'))
}

/// Whether every thread of process `pid` is in state `S`.
fn all_tasks_asleep(pid: u32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("list the waiter's threads");
    tasks.into_iter().all(|t| {
        t.ok()
            .and_then(|t| t.file_name().to_str()?.parse().ok())
            .is_some_and(|tid| task_asleep(pid, tid))
    })
}

/// The state field of a `/proc/.../stat` line (after the parenthesised command name,
/// which may itself contain spaces and parentheses).
fn thread_state(stat: &str) -> Option<char> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// The waiter: `<impl> <dir> <rounds>`.
pub(crate) fn role_waiter(args: &[String]) {
    let name = args.first().expect("implementation").as_str();
    let dir = arg_path(args, 1);
    let rounds: u32 = arg(args, 2);
    let imp: Impl = if name == "raw_futex" {
        None
    } else {
        Some(name.parse().expect("lock kind"))
    };
    let mut locks = imp.map(|k| Locks::open(k, &dir, 1));
    let page = page_in(&dir);
    let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
    page.flag(TID).store(tid, Ordering::Release);
    let word: &AtomicU32 = page.flag(flag::PING);
    for r in 1..=rounds {
        wait_flag(&page, GO, r);
        page.flag(WAITING).store(r, Ordering::Release);
        let t1 = match locks.as_mut() {
            Some(l) => {
                l.lock(0);
                let t = now_ns();
                woken_cpu(&page);
                l.unlock(0);
                t
            }
            None => {
                while word.load(Ordering::Acquire) == 0 {
                    futex_wait(word, 0);
                }
                let t = now_ns();
                woken_cpu(&page);
                t
            }
        };
        page.counter(T_WOKEN).store(t1, Ordering::Release);
        page.flag(DONE).store(r, Ordering::Release);
    }
}

/// Publishes the CPU the waiter runs on (after its timestamp, outside the measurement).
fn woken_cpu(page: &SharedPage) {
    page.flag(WOKEN_CPU)
        .store(rustix::thread::sched_getcpu() as u32, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::thread_state;

    #[test]
    fn reads_the_state_after_the_command_name() {
        assert_eq!(thread_state("123 (cxc-xbench) S 1 2 3"), Some('S'));
        assert_eq!(thread_state("123 (a) b) (c) R 1 2 3"), Some('R'));
        assert_eq!(thread_state("garbage"), None);
    }
}
