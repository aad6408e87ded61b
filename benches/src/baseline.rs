//! The cross-process baselines: raw futex wait/wake on a shared word, a futex mutex
//! (Drepper's three-state mutex), a robust process-shared pthread mutex, the
//! initialisation of a process-shared pthread rwlock, `flock`, and SysV semaphores.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rustix::fs::{FlockOperation, flock};
use rustix::thread::futex;

/// Sleeps while `word == expected` (shared futex: the word may live in a shared mapping).
#[inline]
pub fn futex_wait(word: &AtomicU32, expected: u32) {
    let _ = futex::wait(word, futex::Flags::empty(), expected, None);
}

/// Wakes up to `n` sleepers on `word`.
#[inline]
pub fn futex_wake(word: &AtomicU32, n: u32) {
    let _ = futex::wake(word, futex::Flags::empty(), n);
}

/// Initialises a `pthread_rwlock_t` at `l` with `PTHREAD_PROCESS_SHARED` (glibc's
/// default kind, which prefers readers); panics if a pthread call fails.
///
/// # Safety
/// `l` must be valid for writes of a `pthread_rwlock_t` and suitably aligned, and
/// nobody (in any process) may use it while this runs.
pub unsafe fn init_pshared_rwlock(l: *mut libc::pthread_rwlock_t) {
    let mut attr = std::mem::MaybeUninit::<libc::pthread_rwlockattr_t>::uninit();
    // SAFETY: `attr` is initialised by `pthread_rwlockattr_init` before any other use
    // and destroyed after `pthread_rwlock_init`; `l` is valid, aligned and unused (the
    // caller's contract).
    unsafe {
        assert_eq!(libc::pthread_rwlockattr_init(attr.as_mut_ptr()), 0);
        assert_eq!(
            libc::pthread_rwlockattr_setpshared(attr.as_mut_ptr(), libc::PTHREAD_PROCESS_SHARED),
            0
        );
        assert_eq!(libc::pthread_rwlock_init(l, attr.as_ptr()), 0);
        libc::pthread_rwlockattr_destroy(attr.as_mut_ptr());
    }
}

/// A process-shared futex mutex: 0 unlocked, 1 locked, 2 locked with sleepers
/// (U. Drepper, "Futexes Are Tricky", mutex 2). No spinning before sleeping.
#[derive(Debug, Clone, Copy)]
pub struct FutexMutex<'a>(pub &'a AtomicU32);

impl FutexMutex<'_> {
    /// Locks, sleeping in the kernel while another holder has it.
    pub fn lock(&self) {
        let w = self.0;
        if w.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        while w.swap(2, Ordering::Acquire) != 0 {
            futex_wait(w, 2);
        }
    }

    /// Unlocks, waking one sleeper if there may be one.
    pub fn unlock(&self) {
        if self.0.swap(0, Ordering::Release) == 2 {
            futex_wake(self.0, 1);
        }
    }
}

/// What a robust mutex lock reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locked {
    /// Locked normally.
    Ok,
    /// The previous holder died holding it (`EOWNERDEAD`); it was made consistent.
    OwnerDied,
    /// A timed lock timed out.
    TimedOut,
}

/// A robust, process-shared pthread mutex in a shared mapping.
#[derive(Debug)]
pub struct RobustMutex {
    m: *mut libc::pthread_mutex_t,
}

impl RobustMutex {
    /// Initialises a robust process-shared mutex at `cell` (once, by the creator).
    ///
    /// # Safety
    /// `cell` must be valid for writes of a `pthread_mutex_t`, suitably aligned, in a
    /// shared mapping that outlives every use through [`RobustMutex::at`], and no process
    /// may be using a mutex at `cell`.
    pub unsafe fn init(cell: *mut u8) -> io::Result<RobustMutex> {
        let m = cell.cast::<libc::pthread_mutex_t>();
        let mut attr = std::mem::MaybeUninit::<libc::pthread_mutexattr_t>::uninit();
        // SAFETY: `attr` is initialised by `pthread_mutexattr_init` before any other use
        // and destroyed after `pthread_mutex_init`; `m` is valid and unused (caller).
        unsafe {
            check(libc::pthread_mutexattr_init(attr.as_mut_ptr()))?;
            check(libc::pthread_mutexattr_setpshared(
                attr.as_mut_ptr(),
                libc::PTHREAD_PROCESS_SHARED,
            ))?;
            check(libc::pthread_mutexattr_setrobust(
                attr.as_mut_ptr(),
                libc::PTHREAD_MUTEX_ROBUST,
            ))?;
            let r = libc::pthread_mutex_init(m, attr.as_ptr());
            libc::pthread_mutexattr_destroy(attr.as_mut_ptr());
            check(r)?;
        }
        Ok(RobustMutex { m })
    }

    /// A handle to a mutex another process initialised at `cell`.
    ///
    /// # Safety
    /// A robust mutex must have been initialised at `cell` with [`RobustMutex::init`], in
    /// a shared mapping that outlives the handle.
    pub unsafe fn at(cell: *mut u8) -> RobustMutex {
        RobustMutex { m: cell.cast() }
    }

    /// Locks; recovers (`pthread_mutex_consistent`) a mutex whose holder died.
    pub fn lock(&self) -> Locked {
        // SAFETY: `self.m` is an initialised process-shared mutex (constructor contract).
        let r = unsafe { libc::pthread_mutex_lock(self.m) };
        self.after_lock(r)
    }

    /// Locks with a timeout.
    pub fn lock_timeout(&self, timeout: Duration) -> Locked {
        let mut now = std::mem::MaybeUninit::<libc::timespec>::zeroed();
        // SAFETY: `now` is writable; CLOCK_REALTIME (the clock `timedlock` uses) is valid.
        let mut ts = unsafe {
            libc::clock_gettime(libc::CLOCK_REALTIME, now.as_mut_ptr());
            now.assume_init()
        };
        let ns = ts.tv_nsec as u64 + u64::from(timeout.subsec_nanos());
        ts.tv_sec += timeout.as_secs() as libc::time_t + (ns / 1_000_000_000) as libc::time_t;
        ts.tv_nsec = (ns % 1_000_000_000) as _;
        // SAFETY: `self.m` is an initialised process-shared mutex; `ts` is a valid timespec.
        let r = unsafe { libc::pthread_mutex_timedlock(self.m, &ts) };
        if r == libc::ETIMEDOUT {
            return Locked::TimedOut;
        }
        self.after_lock(r)
    }

    fn after_lock(&self, r: i32) -> Locked {
        match r {
            0 => Locked::Ok,
            libc::EOWNERDEAD => {
                // SAFETY: we hold the mutex (EOWNERDEAD returns it locked to us).
                let c = unsafe { libc::pthread_mutex_consistent(self.m) };
                assert_eq!(c, 0, "pthread_mutex_consistent failed: {c}");
                Locked::OwnerDied
            }
            e => panic!(
                "pthread_mutex_lock failed: {}",
                io::Error::from_raw_os_error(e)
            ),
        }
    }

    /// Unlocks (the caller holds it).
    pub fn unlock(&self) {
        // SAFETY: `self.m` is an initialised mutex held by this thread (caller).
        let r = unsafe { libc::pthread_mutex_unlock(self.m) };
        assert_eq!(r, 0, "pthread_mutex_unlock failed: {r}");
    }
}

fn check(r: i32) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(r))
    }
}

/// An exclusive `flock` on a file (its own open file description per handle).
#[derive(Debug)]
pub struct Flock(File);

impl Flock {
    /// Opens (creating) the lock file at `path`.
    ///
    /// # Errors
    /// I/O errors opening the file.
    pub fn open(path: &Path) -> io::Result<Flock> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        Ok(Flock(f))
    }

    /// Takes the exclusive lock, blocking.
    pub fn lock(&self) {
        flock(&self.0, FlockOperation::LockExclusive).expect("flock(LOCK_EX)");
    }

    /// Releases the lock.
    pub fn unlock(&self) {
        flock(&self.0, FlockOperation::Unlock).expect("flock(LOCK_UN)");
    }
}

/// A SysV semaphore set (`semget`/`semop`), removed on drop by its creator.
#[derive(Debug)]
pub struct SysvSem {
    id: i32,
    owner: bool,
}

impl SysvSem {
    /// Creates a private set of `n` semaphores, all 0.
    ///
    /// # Errors
    /// The OS error of `semget`.
    pub fn create(n: i32) -> io::Result<SysvSem> {
        // SAFETY: plain system call with integer arguments.
        let id = unsafe { libc::semget(libc::IPC_PRIVATE, n, libc::IPC_CREAT | 0o600) };
        if id < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(SysvSem { id, owner: true })
    }

    /// A handle to the set `id` created by another process.
    pub fn attach(id: i32) -> SysvSem {
        SysvSem { id, owner: false }
    }

    /// The set's id (to hand to another process).
    pub fn id(&self) -> i32 {
        self.id
    }

    /// `semop` of `delta` on semaphore `num` (blocking when decrementing below 0).
    pub fn op(&self, num: u16, delta: i16) {
        self.op_flags(num, delta, 0).expect("semop");
    }

    /// `semop` with flags (e.g. `SEM_UNDO`).
    ///
    /// # Errors
    /// The OS error of `semop`.
    pub fn op_flags(&self, num: u16, delta: i16, flags: i16) -> io::Result<()> {
        let mut op = libc::sembuf {
            sem_num: num,
            sem_op: delta,
            sem_flg: flags,
        };
        loop {
            // SAFETY: `op` is one valid `sembuf`; `nsops` is 1.
            let r = unsafe { libc::semop(self.id, &mut op, 1) };
            if r == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Decrements semaphore `num`, waiting at most `timeout`; false on timeout.
    pub fn down_timeout(&self, num: u16, timeout: Duration) -> bool {
        let mut op = libc::sembuf {
            sem_num: num,
            sem_op: -1,
            sem_flg: 0,
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        // SAFETY: `op` is one valid `sembuf`, `ts` a valid relative timeout; both outlive
        // the call (libc has no `semtimedop` wrapper for every target, so use the syscall).
        let r = unsafe {
            libc::syscall(
                libc::SYS_semtimedop,
                self.id,
                &mut op as *mut libc::sembuf,
                1usize,
                &ts as *const libc::timespec,
            )
        };
        r == 0
    }
}

impl Drop for SysvSem {
    fn drop(&mut self) {
        if self.owner {
            // SAFETY: removing a set this process created; no pointers involved.
            unsafe {
                libc::semctl(self.id, 0, libc::IPC_RMID);
            }
        }
    }
}
