//! Read-mostly mix across processes: two processes each take a read lock (and copy the
//! protected value out) 95 % of the time and the write lock (read the value, write it plus
//! one) 5 % of the time, as fast as they can, for a fixed time. `SharedRwLock<u64>`
//! against a `pthread_rwlock_t` initialised `PTHREAD_PROCESS_SHARED` (glibc's default
//! kind, which prefers readers) in the shared page. Both processes draw the same
//! pseudo-random read/write sequence for both locks. The final value is checked against
//! the number of writes (no lost update).
//!
//! Each child pins itself to its own CPU (the first and the second this process may run
//! on), so the two processes run at the same time whenever the machine lets them: without
//! it, on a busy machine the scheduler often runs them in turns on one core, and the
//! figure measures the scheduler more than the locks (trials then varied from 0.5× to 4×).

use std::sync::atomic::Ordering;

use cxc::SharedRwLock;

use super::{Config, arg, arg_path, finish, page_in, row, scratch, spawn, wait_flag, wanted};
use crate::clock::now_ns;
use crate::shm::{SharedPage, counter, flag};
use crate::stats::summarize;

/// Share of operations that take the write lock, in percent.
pub(crate) const WRITE_PERCENT: u64 = 5;
/// Lock cell of the shared page that holds the pthread rwlock.
const CELL: usize = 0;

/// A `pthread_rwlock_t` with `PTHREAD_PROCESS_SHARED` in a lock cell of a shared page.
pub(crate) struct PthreadRwLock<'a> {
    lock: *mut libc::pthread_rwlock_t,
    _page: &'a SharedPage,
}

const _: () = assert!(size_of::<libc::pthread_rwlock_t>() <= crate::shm::CELL);

impl<'a> PthreadRwLock<'a> {
    /// Initialises the lock in cell `i` of `page`.
    ///
    /// # Safety
    /// Nobody (in any process) may use cell `i` as anything else, and nobody may use the
    /// lock while this runs.
    pub(crate) unsafe fn init(page: &'a SharedPage, i: usize) -> Self {
        let l = page.cell(i).cast::<libc::pthread_rwlock_t>();
        // SAFETY: `l` points to a 64-byte aligned cell of at least
        // `size_of::<pthread_rwlock_t>()` bytes (const-asserted) inside the mapping, which
        // `page` keeps alive; nobody else uses it now (caller).
        unsafe { crate::baseline::init_pshared_rwlock(l) };
        PthreadRwLock {
            lock: l,
            _page: page,
        }
    }

    /// The lock another process initialised in cell `i` of `page` (same file).
    ///
    /// # Safety
    /// Cell `i` must hold a lock initialised by [`PthreadRwLock::init`] (in any process)
    /// and be used as nothing else.
    pub(crate) unsafe fn attach(page: &'a SharedPage, i: usize) -> Self {
        PthreadRwLock {
            lock: page.cell(i).cast(),
            _page: page,
        }
    }

    /// `pthread_rwlock_rdlock`.
    pub(crate) fn read(&self) {
        // SAFETY: the lock was initialised (`init`/`attach` contracts) and the mapping is
        // alive as long as `_page`.
        let r = unsafe { libc::pthread_rwlock_rdlock(self.lock) };
        assert_eq!(r, 0, "pthread_rwlock_rdlock");
    }

    /// `pthread_rwlock_wrlock`.
    pub(crate) fn write(&self) {
        // SAFETY: as in `read`.
        let r = unsafe { libc::pthread_rwlock_wrlock(self.lock) };
        assert_eq!(r, 0, "pthread_rwlock_wrlock");
    }

    /// `pthread_rwlock_unlock`, by the thread that locked.
    pub(crate) fn unlock(&self) {
        // SAFETY: as in `read`.
        let r = unsafe { libc::pthread_rwlock_unlock(self.lock) };
        assert_eq!(r, 0, "pthread_rwlock_unlock");
    }
}

/// The implementations measured.
const KINDS: [&str; 2] = ["rwlock", "pthread_rwlock"];

/// Parent side: both implementations, trials interleaved.
pub(crate) fn run(cfg: &Config) {
    let kinds: Vec<&str> = KINDS
        .into_iter()
        .filter(|k| wanted(&format!("rw_mix/{k}")))
        .collect();
    let mut rates = vec![Vec::new(); kinds.len()];
    for _ in 0..cfg.tput_trials {
        for (k, r) in kinds.iter().zip(rates.iter_mut()) {
            r.push(trial(k, cfg));
        }
    }
    for (k, r) in kinds.iter().zip(&rates) {
        row(&format!("rw_mix/{k}"), "ops/s", summarize(r));
    }
}

fn trial(kind: &str, cfg: &Config) -> f64 {
    let dir = scratch();
    let page = page_in(dir.path());
    let lock_path = dir.path().join("mix.rw");
    let _lock = (kind == "rwlock")
        .then(|| SharedRwLock::<u64>::create(&lock_path, 0).expect("create rwlock"));
    // SAFETY: cell CELL of this fresh page is used for nothing else, and the children
    // that use the lock are spawned below, after the initialisation.
    let _pthread = (kind != "rwlock").then(|| unsafe { PthreadRwLock::init(&page, CELL) });
    let dir_s = dir.path().to_str().expect("utf-8 temp path");
    let children = [
        spawn("rw-mix", &[kind, dir_s, "1"]),
        spawn("rw-mix", &[kind, dir_s, "2"]),
    ];
    wait_flag(&page, flag::READY, 2);
    let t0 = now_ns();
    page.flag(flag::START).store(1, Ordering::Release);
    std::thread::sleep(cfg.tput_time);
    page.flag(flag::STOP).store(1, Ordering::Release);
    let t1 = now_ns();
    let (mut total, mut writes) = (0u64, 0u64);
    for c in children {
        let out = finish(c, "rw-mix");
        let mut f = out.split_whitespace().map(|w| w.parse::<u64>());
        match (f.next(), f.next()) {
            (Some(Ok(n)), Some(Ok(w))) => {
                total += n;
                writes += w;
            }
            _ => panic!("rw-mix child printed {out:?}"),
        }
    }
    let value = if kind == "rwlock" {
        let lock = SharedRwLock::<u64>::open(&lock_path).expect("open rwlock");
        lock.read().get()
    } else {
        page.counter(counter::VALUE).load(Ordering::Acquire)
    };
    assert_eq!(
        value, writes,
        "{kind}: protected value {value} != writes {writes}: lost updates"
    );
    total as f64 / ((t1 - t0) as f64 / 1e9)
}

/// Pins this process to the `k`-th CPU it may run on, if it may run on more than `k`
/// (otherwise leaves it unpinned).
fn pin_to_own_cpu(k: usize) {
    use rustix::thread::{CpuSet, sched_getaffinity, sched_setaffinity};
    let Ok(allowed) = sched_getaffinity(None) else {
        return;
    };
    let cpus: Vec<usize> = (0..CpuSet::MAX_CPU)
        .filter(|&c| allowed.is_set(c))
        .collect();
    if cpus.len() < 2 {
        return;
    }
    if let Some(&cpu) = cpus.get(k) {
        let mut one = CpuSet::new();
        one.set(cpu);
        let _ = sched_setaffinity(None, &one);
    }
}

/// A small deterministic generator (xorshift64*), the same sequence for both locks.
struct Mix(u64);

impl Mix {
    fn write(&mut self) -> bool {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) % 100 < WRITE_PERCENT
    }
}

/// Child: `<rwlock|pthread_rwlock> <dir> <seed>`; prints its operations and writes.
pub(crate) fn role(args: &[String]) {
    let kind = args.first().expect("kind").clone();
    let dir = arg_path(args, 1);
    let seed: u64 = arg(args, 2);
    let page = page_in(&dir);
    pin_to_own_cpu(seed as usize - 1);
    let mut mix = Mix(0x9E37_79B9_7F4A_7C15 ^ seed);
    let (mut n, mut writes) = (0u64, 0u64);
    let ready = |page: &SharedPage| {
        page.flag(flag::READY).fetch_add(1, Ordering::AcqRel);
        while page.flag(flag::START).load(Ordering::Acquire) == 0 {
            std::hint::spin_loop();
        }
    };
    let stop = |page: &SharedPage| page.flag(flag::STOP).load(Ordering::Relaxed) != 0;
    if kind == "rwlock" {
        let lock = SharedRwLock::<u64>::open(dir.join("mix.rw")).expect("open rwlock");
        ready(&page);
        while !stop(&page) {
            if mix.write() {
                let g = lock.write();
                let v = g.read().expect("write lock lost");
                g.write(v + 1).expect("write lock lost");
                drop(g);
                writes += 1;
            } else {
                std::hint::black_box(lock.read().get());
            }
            n += 1;
        }
    } else {
        // SAFETY: the parent initialised the lock in cell CELL before spawning us, and
        // the cell is used for nothing else.
        let lock = unsafe { PthreadRwLock::attach(&page, CELL) };
        let value = page.counter(counter::VALUE);
        ready(&page);
        while !stop(&page) {
            if mix.write() {
                lock.write();
                let v = value.load(Ordering::Relaxed);
                value.store(v + 1, Ordering::Relaxed);
                lock.unlock();
                writes += 1;
            } else {
                lock.read();
                std::hint::black_box(value.load(Ordering::Relaxed));
                lock.unlock();
            }
            n += 1;
        }
    }
    println!("{n} {writes}");
}
