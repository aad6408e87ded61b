#![cfg(not(cxc_loom))]
#![cfg(feature = "async")]
#![allow(unsafe_code)]
//! attack31: the lease's guards, claims and async waiting, with real processes.
//!
//! 1. A process without an identity slot (a full table) waiting for a vacant lease:
//!    `lock_timeout` and `lock_async` (which busy-looped, about 0.9 s of CPU a second,
//!    before its reactor check let slotless waiters try at growing intervals).
//! 2. A process that has its slots (one for its seed calls and claims, one for its
//!    guards: a guard's claim is kept apart from the pid calls') claiming through both in
//!    a full table. (Before the docs said so, it had only used the seed calls, and its
//!    guard was refused.)
//! 3. A guard copied into a forked child: `lost()` at once, inert, dropped without
//!    releasing; the child's own `lock_async` waits for the parent and then claims.
//! 4. Chaos: guards of every kind, async futures cancelled at random and fenced claims in
//!    three processes; holders SIGKILLed and SIGSTOPped past the grace, waiters stopped.
//! 5. A guard claimed for another live process's pid (`LeaseBuilder::pid`).

mod procs;

use procs::words;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cxc_sync::OwnerLease;
use cxc_testkit::{
    Proc, RoleCommand, arg, mono_ns, num, path_arg, process_cpu, serial, sleep_forever,
};
use procs::{report, role};

const REPORT_WAIT: Duration = Duration::from_secs(20);

fn me() -> u32 {
    std::process::id()
}

/// Pids a filler claims for: one identity slot each.
const FILL_BASE: u32 = 3_000_000;

fn current_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

/// Role: registers (and pins) `n` identity slots by claiming for `n` distinct pids, then
/// lives until killed.
fn role_filler() {
    assert_eq!(role().as_deref(), Some("filler"));
    let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
    let n: u32 = arg("n").parse().unwrap();
    for k in 0..n {
        if lease.try_acquire(FILL_BASE + k, 1 << 40) {
            assert!(lease.release(FILL_BASE + k));
        }
    }
    report(format!("filled={n}"));
    sleep_forever();
}

// ---------------------------------------------------------------------------------------
// 1. lock_async in a process without an identity slot (a full table).
// ---------------------------------------------------------------------------------------

const T1: &str =
    "lock_async_without_a_slot_in_a_full_table_waits_idle_and_claims_once_a_slot_frees";

/// Role: a process without a slot awaits `lock_async` (phase 1: 1 s timeout, CPU
/// measured), then awaits it again until a slot frees (phase 2).
fn role_async_newcomer() {
    let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
    let rt = current_rt();
    let cpu0 = process_cpu();
    let t = Instant::now();
    let got = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(1), lease.lock_async())
            .await
            .map(|g| g.token())
            .ok()
    });
    let cpu = process_cpu().saturating_sub(cpu0);
    report(format!(
        "phase=1 got={} cpu_ms={} wall_ms={}",
        got.is_some(),
        cpu.as_millis(),
        t.elapsed().as_millis()
    ));
    let g = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(15), lease.lock_async())
            .await
            .ok()
    });
    report(format!("phase=2 got={} at_ns={}", g.is_some(), mono_ns()));
    drop(g);
}

/// Role: as `async_newcomer`, with the blocking `lock_timeout` (the control).
fn role_blocking_newcomer() {
    let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
    let cpu0 = process_cpu();
    let t = Instant::now();
    let got = lease
        .lock_timeout(Duration::from_secs(1))
        .map(|g| g.token());
    let cpu = process_cpu().saturating_sub(cpu0);
    report(format!(
        "phase=1 got={} cpu_ms={} wall_ms={}",
        got.is_some(),
        cpu.as_millis(),
        t.elapsed().as_millis()
    ));
    let g = lease.lock_timeout(Duration::from_secs(15));
    report(format!("phase=2 got={} at_ns={}", g.is_some(), mono_ns()));
    drop(g);
}

fn full_table_newcomer(test: &str, newcomer: &str) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let _lease: OwnerLease<u64> = OwnerLease::builder(&path).create(0).unwrap();
    let mut filler = RoleCommand::new(test, "filler")
        .arg("path", &path)
        .arg("n", "64")
        .spawn();
    assert_eq!(filler.next_report(REPORT_WAIT), "filled=64");
    let mut n = RoleCommand::new(test, newcomer).arg("path", &path).spawn();
    let l1 = n.next_report(REPORT_WAIT);
    println!("{newcomer}, full table, vacant lease: {l1}");
    assert!(l1.contains("got=false"), "claimed without a slot: {l1}");
    let t_kill = mono_ns();
    filler.kill();
    let l2 = n.next_report(REPORT_WAIT);
    let after_ms = num(&l2, "at_ns").saturating_sub(t_kill) / 1_000_000;
    println!("{newcomer} after the filler died: {l2} ({after_ms} ms after the kill)");
    assert!(l2.contains("got=true"), "{l2}");
    (num(&l1, "cpu_ms"), after_ms)
}

/// owner-lease.md, Identity: "A full table (64 slots held by live processes ...): a
/// process without a slot ... cannot claim (`try_acquire` false; `acquire` and `lock` wait
/// for a slot until their timeout, looking again every 5 ms)".
///
/// The control for the async test below: a live filler pins all 64 slots, the lease is
/// vacant; a process without a slot blocks in `lock_timeout(1 s)` (refused), then again:
/// once the filler is SIGKILLed it must get the lease promptly.
#[test]
fn lock_timeout_without_a_slot_in_a_full_table_claims_once_a_slot_frees() {
    cxc_testkit::play_role!(role_filler, role_blocking_newcomer);
    let _s = serial();
    let (cpu, after) = full_table_newcomer(T1B, "blocking_newcomer");
    println!("blocking: cpu {cpu} ms in its 1 s wait, claimed {after} ms after the kill");
    assert!(after < 500, "blocking waiter late: {after} ms");
}

const T1B: &str = "lock_timeout_without_a_slot_in_a_full_table_claims_once_a_slot_frees";

/// The same promise for `lock_async`; async.md: "No thread and no timer per waiter",
/// "2,000 waiters idle for 2 s use 0.15–0.33 % of one core"; the semaphore's async waiter
/// of a process without a holder slot "looks for a slot with each reclaim ... instead of
/// being woken over and over while permits are free".
///
/// A process without a slot awaits `lock_async` for 1 s on the vacant lease of a full
/// table: it must not get the lease, and must not burn a CPU meanwhile (the lock group's
/// check says "vacant: poll now", the poll cannot claim without a slot, re-arms, and the
/// reactor runs the check again at once). Then the filler dies: the waiter must get the
/// lease promptly.
#[test]
fn lock_async_without_a_slot_in_a_full_table_waits_idle_and_claims_once_a_slot_frees() {
    cxc_testkit::play_role!(role_filler, role_async_newcomer);
    let _s = serial();
    let (cpu, after) = full_table_newcomer(T1, "async_newcomer");
    println!("async: cpu {cpu} ms in its 1 s wait, claimed {after} ms after the kill");
    assert!(after < 500, "async waiter late: {after} ms");
    assert!(
        cpu < 100,
        "an async waiter without a slot burnt {cpu} ms of CPU in its 1 s wait"
    );
}

// ---------------------------------------------------------------------------------------
// 2. A process that has a slot (seed calls) locks a guard in a full table.
// ---------------------------------------------------------------------------------------

const T2: &str = "process_with_a_slot_is_not_refused_a_guard_by_a_full_table";

/// Role: claims and releases with the seed calls for its own pid (its one slot), waits
/// for the parent's go (the table is full then), and tries the seed call and a guard on
/// the vacant lease.
fn role_slotted() {
    let lease: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
    assert!(lease.try_acquire(me(), 1 << 40), "vacant");
    assert!(lease.release(me()));
    // A guard's slot is its own (owner-lease.md, Identity).
    drop(lease.try_lock().expect("vacant"));
    report("slotted");
    cxc_testkit::child_wait_for_path(&path_arg("go"), Duration::from_secs(20));
    let seed = lease.try_acquire(me(), 1 << 40);
    if seed {
        assert!(lease.release(me()));
    }
    let guard = lease.try_lock().is_some();
    let t = Instant::now();
    let timed = lease.lock_timeout(Duration::from_millis(500)).is_some();
    report(format!(
        "seed={seed} try_lock={guard} lock_timeout={timed} waited_ms={}",
        t.elapsed().as_millis()
    ));
}

/// owner-lease.md, Identity: "A process registers one slot per pid it claims for through
/// the seed calls and the claims API, and one more per pid for its guards ... Processes
/// that have a slot are never refused because of the table".
///
/// A process claims once through the seed calls and once through a guard for its own pid
/// (its two slots); a filler pins the other 62 slots; the lease is vacant. Both the seed
/// call and the guard claim again.
#[test]
fn process_with_a_slot_is_not_refused_a_guard_by_a_full_table() {
    cxc_testkit::play_role!(role_filler, role_slotted);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let go = dir.path().join("go");
    let _lease: OwnerLease<u64> = OwnerLease::builder(&path).create(0).unwrap();
    let mut x = RoleCommand::new(T2, "slotted")
        .arg("path", &path)
        .arg("go", &go)
        .spawn();
    assert_eq!(x.next_report(REPORT_WAIT), "slotted");
    let mut filler = RoleCommand::new(T2, "filler")
        .arg("path", &path)
        .arg("n", "62")
        .spawn();
    assert_eq!(filler.next_report(REPORT_WAIT), "filled=62");
    std::fs::write(&go, b"").unwrap();
    let line = x.next_report(REPORT_WAIT);
    println!("a process with its slots, full table, vacant lease: {line}");
    filler.kill();
    assert!(line.contains("seed=true"), "control: {line}");
    assert!(
        line.contains("try_lock=true") && line.contains("lock_timeout=true"),
        "the process has a slot, yet its guard was refused by the full table: {line}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. A guard copied into a forked child: `lost()`, drop, and the child's own `lock_async`.
// ---------------------------------------------------------------------------------------

const T3: &str =
    "forked_childs_copy_of_a_guard_is_lost_at_once_and_its_lock_async_waits_for_the_parent";

fn manual_builder(path: &Path) -> cxc_sync::LeaseBuilder {
    cxc_sync::LeaseBuilder::new(path).epoch(cxc_sync::EpochMode::Manual)
}

/// Role: locks a guard (manual epochs: only a release or a death ends it), forks. The
/// child checks its copy (`is_current`, `lost()`, `write`, drop), `try_lock`s, then awaits
/// `lock_async`. The parent waits for the test's marker, writes 2 and unlocks.
fn role_forker() {
    let lease: OwnerLease<u64> = manual_builder(&path_arg("path")).open().unwrap();
    let g = lease.try_lock().expect("vacant");
    g.write(1).unwrap();
    let token = g.token();
    // SAFETY: the child makes lease calls, builds a runtime, reports and `_exit`s.
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        let rt = current_rt();
        let cur = g.is_current();
        let t = Instant::now();
        let lost = rt
            .block_on(async { tokio::time::timeout(Duration::from_millis(500), g.lost()).await })
            .is_ok();
        let lost_ms = t.elapsed().as_millis();
        let wrote = g.write(666).is_ok();
        let beat = g.beat().is_ok();
        drop(g);
        let try_lock = lease.try_lock().is_some();
        let seed = lease.try_acquire(me(), 1 << 40);
        report(format!(
            "CHILD current={cur} lost={lost} lost_ms={lost_ms} write={wrote} beat={beat} \
             try_lock={try_lock} seed={seed}"
        ));
        let got = rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(15), lease.lock_async())
                .await
                .ok()
        });
        let at = mono_ns();
        let (tok, val) = got
            .as_ref()
            .map_or((0, 0), |g| (g.token(), g.read().unwrap_or(0)));
        report(format!(
            "CHILDGOT got={} at_ns={at} token={tok} value={val}",
            got.is_some()
        ));
        drop(got);
        // SAFETY: ends the forked child without the parent's atexit handlers.
        unsafe { libc::_exit(0) };
    }
    report(format!("PARENT child={child} token={token}"));
    cxc_testkit::child_wait_for_path(&path_arg("go"), Duration::from_secs(20));
    let cur = g.is_current();
    let read = g.read().unwrap_or(0);
    let wrote = g.write(2).is_ok();
    let at = mono_ns();
    let unlocked = g.unlock().is_ok();
    report(format!(
        "PARENTREL current={cur} read={read} wrote={wrote} unlocked={unlocked} at_ns={at}"
    ));
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(child, &mut status, 0) };
    let after = lease.try_lock().map(|g| g.read().unwrap_or(0));
    report(format!("PARENTEND child_status={status} relock={after:?}"));
}

/// owner-lease.md: "A `LeaseClaim` token or a guard copied into a forked child ... cannot
/// write, read, beat or release (only `is_current` answers)"; "the child is a new identity
/// and registers its own slot"; async.md: `lost()` resolves "once the guard's claim is no
/// longer current"; "`lock_async()` and the others work in a forked child as in any
/// process".
///
/// The child's copy of the parent's guard is not current, its `lost()` resolves at once,
/// it cannot write or beat, and dropping it releases nothing; the child's own `try_lock`
/// and seed claim are refused while the parent holds. Its `lock_async` waits (the parent
/// is a live holder) and gets the lease promptly once the parent unlocks, with a larger
/// token and the parent's last value; afterwards the parent can lock again (the child
/// released).
#[test]
fn forked_childs_copy_of_a_guard_is_lost_at_once_and_its_lock_async_waits_for_the_parent() {
    cxc_testkit::play_role!(role_forker);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let go = dir.path().join("go");
    let lease: OwnerLease<u64> = manual_builder(&path).create(0).unwrap();
    let mut p = RoleCommand::new(T3, "forker")
        .arg("path", &path)
        .arg("go", &go)
        .spawn();
    let mut lines = Vec::new();
    while !(lines.iter().any(|l: &String| l.starts_with("CHILD "))
        && lines.iter().any(|l: &String| l.starts_with("PARENT ")))
    {
        lines.push(p.next_report(REPORT_WAIT));
    }
    let child = lines
        .iter()
        .find(|l| l.starts_with("CHILD "))
        .unwrap()
        .clone();
    let parent = lines
        .iter()
        .find(|l| l.starts_with("PARENT "))
        .unwrap()
        .clone();
    println!("{parent}\n{child}");
    assert_eq!(
        child,
        format!(
            "CHILD current=false lost=true lost_ms={} write=false beat=false try_lock=false seed=false",
            cxc_testkit::fields(&child)["lost_ms"]
        ),
        "the child's copy of the guard acted, or the child claimed a held lease"
    );
    assert!(num(&child, "lost_ms") < 100, "{child}");
    // The child waits in lock_async; the parent holds.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        lease.current_owner(),
        Some(p.pid()),
        "the parent's claim ended"
    );
    std::fs::write(&go, b"").unwrap();
    let mut rest = Vec::new();
    while !rest.iter().any(|l: &String| l.starts_with("PARENTEND")) {
        rest.push(p.next_report(REPORT_WAIT));
    }
    println!("{rest:#?}");
    let rel = rest.iter().find(|l| l.starts_with("PARENTREL")).unwrap();
    let got = rest.iter().find(|l| l.starts_with("CHILDGOT")).unwrap();
    let end = rest.iter().find(|l| l.starts_with("PARENTEND")).unwrap();
    assert_eq!(
        rel,
        &format!(
            "PARENTREL current=true read=1 wrote=true unlocked=true at_ns={}",
            num(rel, "at_ns")
        ),
        "the child's copy disturbed the parent's guard"
    );
    assert!(cxc_testkit::flag(got, "got"), "{got}");
    assert!(num(got, "token") > num(&parent, "token"), "{got}");
    assert_eq!(num(got, "value"), 2, "{got}");
    let late_ms = num(got, "at_ns").saturating_sub(num(rel, "at_ns")) / 1_000_000;
    println!("the child's lock_async claimed {late_ms} ms after the parent's unlock");
    assert!(
        late_ms < 150,
        "the child's lock_async was woken late: {late_ms} ms"
    );
    assert!(end.contains("relock=Some(2)"), "{end}");
}

// ---------------------------------------------------------------------------------------
// 4. Chaos: guards (lock, lock_timeout, lock_owned, lock_async, lock_owned_async) and
//    claims in many threads and tasks of several processes; holders SIGKILLed and
//    SIGSTOPped past the grace at random; every waiter must still get the lease.
// ---------------------------------------------------------------------------------------

const T4: &str = "guard_chaos_of_kills_and_stops_never_publishes_a_superseded_write_and_every_waiter_gets_the_lease";

type P6 = [u64; 6];
/// Shared words of the chaos test.
const C_MAXGRANT: usize = 0; // highest token that entered its critical section
const C_MAXW: usize = 1; // highest token whose write succeeded
const C_VIOL: usize = 2; // violations
const C_FIRST: usize = 3; // the first violation: code << 56 | token
const C_STOP: usize = 4; // 1: chaos over, finish
const C_ACQ: usize = 5; // critical sections entered
const C_WRITES: usize = 6; // successful writes
const C_LOST: usize = 7; // writes refused as lost
const C_NOBUF: usize = 8; // writes refused for lack of a buffer
const C_TORN: usize = 9; // claims told the payload may be inconsistent
const C_WORDS: usize = 10;

const CHAOS_GRACE_MS: u64 = 40;
/// Acquisitions every waiter must make after the chaos.
const FINAL_ROUNDS: u64 = 2;

fn chaos_value(token: u64, k: u64) -> P6 {
    cxc_testkit::sealed(token << 12 | (k & 0xFFF))
}

struct Chaos {
    w: &'static [std::sync::atomic::AtomicU64],
}

impl Chaos {
    fn viol(&self, code: u64, token: u64, what: &str) {
        use std::sync::atomic::Ordering::SeqCst;
        eprintln!("VIOLATION {code}: {what} (token {token}, pid {})", me());
        self.w[C_VIOL].fetch_add(1, SeqCst);
        let _ = self.w[C_FIRST].compare_exchange(0, code << 56 | token, SeqCst, SeqCst);
    }
    fn add(&self, i: usize) {
        self.w[i].fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn stopped(&self) -> bool {
        self.w[C_STOP].load(std::sync::atomic::Ordering::SeqCst) != 0
    }

    /// Entry checks of a claim with `token` that read `v` (None: refused as lost).
    fn enter(&self, token: u64, maxw: u64, v: Option<P6>) {
        use std::sync::atomic::Ordering::SeqCst;
        self.add(C_ACQ);
        self.w[C_MAXGRANT].fetch_max(token, SeqCst);
        let Some(v) = v else { return };
        if !cxc_testkit::intact(&v) {
            self.viol(1, token, &format!("torn payload {v:?}"));
            return;
        }
        let t = v[0] >> 12;
        if t >= token {
            self.viol(2, token, &format!("payload of token {t} at entry"));
        }
        if t < maxw {
            self.viol(
                3,
                token,
                &format!("payload of token {t}, but {maxw} published before"),
            );
        }
    }

    /// One write attempt of the claim `token` (`k`-th): `Some(ok)`, `None` if lost.
    fn write(
        &self,
        token: u64,
        k: u64,
        write: impl FnOnce(P6) -> Result<(), cxc_sync::GuardError>,
        read: impl FnOnce() -> Option<P6>,
    ) -> Option<bool> {
        use std::sync::atomic::Ordering::SeqCst;
        let granted = self.w[C_MAXGRANT].load(SeqCst);
        let v = chaos_value(token, k);
        match write(v) {
            Ok(()) => {
                self.add(C_WRITES);
                if granted > token {
                    self.viol(
                        4,
                        token,
                        &format!("published after claim {granted} had entered"),
                    );
                }
                self.w[C_MAXW].fetch_max(token, SeqCst);
                if let Some(r) = read()
                    && r != v
                {
                    self.viol(5, token, &format!("read back {r:?}, wrote {v:?}"));
                }
                Some(true)
            }
            Err(cxc_sync::GuardError::Lost { .. }) => {
                self.add(C_LOST);
                None
            }
            Err(cxc_sync::GuardError::NoBuffer) => {
                self.add(C_NOBUF);
                Some(false)
            }
            Err(e) => {
                self.viol(6, token, &format!("write error {e:?}"));
                None
            }
        }
    }

    /// The critical section of a guard (`read` / `write` / `is_current` / `token` /
    /// `acknowledge_inconsistent` given as closures, so borrowed and owned guards share
    /// it). Returns whether the claim was lost.
    fn guard_section(&self, rng: &mut cxc_testkit::Rng, g: &dyn GuardLike) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        let token = g.token();
        let maxw = self.w[C_MAXW].load(SeqCst);
        let v = match g.read() {
            Ok(v) => Some(v),
            Err(cxc_sync::GuardError::Inconsistent) => {
                self.add(C_TORN);
                g.ack();
                g.read().ok()
            }
            Err(_) => None,
        };
        self.enter(token, maxw, v);
        let n = rng.range(1, 4);
        for k in 0..n {
            if rng.percent(30) {
                std::thread::sleep(Duration::from_micros(rng.below(1500)));
            }
            if self
                .write(token, k, |v| g.write(v), || g.read().ok())
                .is_none()
            {
                if g.is_current() {
                    self.viol(7, token, "write refused as lost, guard still current");
                }
                return true;
            }
        }
        false
    }
}

/// What the chaos needs of a guard (borrowed or owned).
trait GuardLike {
    fn token(&self) -> u64;
    fn read(&self) -> Result<P6, cxc_sync::GuardError>;
    fn write(&self, v: P6) -> Result<(), cxc_sync::GuardError>;
    fn is_current(&self) -> bool;
    fn ack(&self);
    fn wait_lost(&self, t: Duration) -> bool;
}

macro_rules! guard_like {
    ($t:ty) => {
        impl GuardLike for $t {
            fn token(&self) -> u64 {
                <$t>::token(self)
            }
            fn read(&self) -> Result<P6, cxc_sync::GuardError> {
                <$t>::read(self)
            }
            fn write(&self, v: P6) -> Result<(), cxc_sync::GuardError> {
                <$t>::write(self, v)
            }
            fn is_current(&self) -> bool {
                <$t>::is_current(self)
            }
            fn ack(&self) {
                <$t>::acknowledge_inconsistent(self)
            }
            fn wait_lost(&self, t: Duration) -> bool {
                <$t>::wait_lost(self, t)
            }
        }
    };
}
guard_like!(cxc_sync::LeaseGuard<'_, P6>);
guard_like!(cxc_sync::OwnedLeaseGuard<P6>);

fn chaos_open(path: &Path) -> Arc<OwnerLease<P6>> {
    Arc::new(
        cxc_sync::LeaseBuilder::new(path)
            .grace(Duration::from_millis(CHAOS_GRACE_MS))
            .open()
            .unwrap(),
    )
}

/// After a section that lost its claim: the loss must be visible to `wait_lost`.
fn check_lost(c: &Chaos, g: &dyn GuardLike) {
    if !g.wait_lost(Duration::from_millis(300)) {
        c.viol(
            8,
            g.token(),
            "wait_lost did not see a loss that a write saw",
        );
    }
}

/// Role: a chaos worker process: blocking guard threads, a claims thread and async tasks.
fn role_chaos() {
    let path = path_arg("path");
    let lease = chaos_open(&path);
    let c = Chaos {
        w: words(&path_arg("shared"), C_WORDS),
    };
    let seed: u64 = arg("seed").parse().unwrap();
    let c = &c;
    std::thread::scope(|s| {
        // 0: lock(); 1: lock_timeout(); 2: lock_owned(); 3: claims.
        for kind in 0..4u64 {
            let lease = lease.clone();
            s.spawn(move || {
                let mut rng = cxc_testkit::Rng::derive(seed, u64::from(me()), kind, 0);
                let mut fin = 0;
                while fin < FINAL_ROUNDS {
                    let done = c.stopped();
                    let entered = match kind {
                        0 => {
                            let g = lease.lock();
                            if c.guard_section(&mut rng, &g) {
                                check_lost(c, &g);
                            }
                            if rng.percent(50) {
                                let _ = g.unlock();
                            }
                            true
                        }
                        1 => {
                            let t = if done {
                                Duration::from_secs(60)
                            } else {
                                Duration::from_millis(rng.range(1, 60))
                            };
                            match lease.lock_timeout(t) {
                                Some(g) => {
                                    if c.guard_section(&mut rng, &g) {
                                        check_lost(c, &g);
                                    }
                                    true
                                }
                                None => false,
                            }
                        }
                        2 => {
                            let g = lease.clone().lock_owned();
                            if c.guard_section(&mut rng, &g) {
                                check_lost(c, &g);
                            }
                            true
                        }
                        _ => claim_section(c, &lease, &mut rng, done),
                    };
                    if done && entered {
                        fin += 1;
                    }
                    std::thread::sleep(Duration::from_micros(rng.below(2000)));
                }
            });
        }
        // Async tasks on one current-thread runtime.
        let lease = lease.clone();
        s.spawn(move || {
            let rt = current_rt();
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async {
                let tasks: Vec<_> = (0..4u64)
                    .map(|t| {
                        let lease = lease.clone();
                        tokio::task::spawn_local(async_waiter(c_static(c), lease, seed, t))
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
            });
        });
    });
    report("done");
}

/// The chaos words of this process (the mapping is never unmapped).
fn c_static(c: &Chaos) -> &'static Chaos {
    Box::leak(Box::new(Chaos { w: c.w }))
}

async fn async_waiter(c: &'static Chaos, lease: Arc<OwnerLease<P6>>, seed: u64, t: u64) {
    let mut rng = cxc_testkit::Rng::derive(seed, u64::from(me()), 10 + t, 0);
    let mut fin = 0;
    while fin < FINAL_ROUNDS {
        let done = c.stopped();
        let limit = if done {
            Duration::from_secs(60)
        } else {
            Duration::from_millis(rng.range(1, 80))
        };
        let entered = if t.is_multiple_of(2) {
            match tokio::time::timeout(limit, lease.lock_async()).await {
                Ok(g) => {
                    async_section(c, &mut rng, &g, g.lost()).await;
                    true
                }
                Err(_) => false,
            }
        } else {
            match tokio::time::timeout(limit, lease.clone().lock_owned_async()).await {
                Ok(g) => {
                    async_section(c, &mut rng, &g, g.lost()).await;
                    true
                }
                Err(_) => false,
            }
        };
        if done && entered {
            fin += 1;
        }
        tokio::task::yield_now().await;
    }
}

async fn async_section(
    c: &Chaos,
    rng: &mut cxc_testkit::Rng,
    g: &dyn GuardLike,
    lost: impl std::future::Future<Output = ()>,
) {
    if c.guard_section(rng, g)
        && tokio::time::timeout(Duration::from_millis(300), lost)
            .await
            .is_err()
    {
        c.viol(
            9,
            g.token(),
            "lost() did not resolve after a write saw the loss",
        );
    }
}

/// One round of the claims thread: `acquire`, `read_claimed`, `write_claimed`s,
/// `release_claim`. Whether it claimed.
fn claim_section(
    c: &Chaos,
    lease: &OwnerLease<P6>,
    rng: &mut cxc_testkit::Rng,
    done: bool,
) -> bool {
    use std::sync::atomic::Ordering::SeqCst;
    let t = if done {
        Duration::from_secs(60)
    } else {
        Duration::from_millis(rng.range(1, 60))
    };
    let Some(claim) = lease.acquire(me(), CHAOS_GRACE_MS, t) else {
        return false;
    };
    let token = claim.generation();
    if claim.payload_may_be_inconsistent() {
        c.add(C_TORN);
    }
    let maxw = c.w[C_MAXW].load(SeqCst);
    c.enter(token, maxw, lease.read_claimed(&claim));
    for k in 0..rng.range(1, 4) {
        let r = c.write(
            token,
            k,
            |v| {
                if lease.write_claimed(&claim, v) {
                    Ok(())
                } else if lease.is_current(&claim) {
                    Err(cxc_sync::GuardError::NoBuffer)
                } else {
                    Err(cxc_sync::GuardError::Lost { successor: None })
                }
            },
            || lease.read_claimed(&claim),
        );
        if r.is_none() {
            break;
        }
        if !lease.beat_claimed(&claim) && lease.is_current(&claim) {
            c.viol(10, token, "beat_claimed refused a current claim");
        }
    }
    let released = lease.release_claim(&claim);
    if released && lease.is_current(&claim) {
        c.viol(11, token, "released, still current");
    }
    true
}

/// docs: "A claim belongs to its claim token"; L1/L2 ("every successful owner operation
/// ... linearizes at an instant when the caller is the current holder"); "a superseded
/// guard never publishes"; "A stopped (SIGSTOPped) holder, even mid-write, is replaced
/// after the grace ... Its later operations fail, and a write it was making is never
/// published"; a crashed holder "is replaced at once"; async.md cancellation ("Dropping a
/// `lock_async` ... future at any point leaves no claim ... behind"; no wake-up lost) and
/// `lost()`.
///
/// Three worker processes, each with a `lock()` thread, a `lock_timeout` thread (random
/// timeouts), a `lock_owned` thread, a claims thread (`acquire`/`write_claimed`/
/// `release_claim`) and four async tasks (`lock_async` / `lock_owned_async` under random
/// timeouts: cancelled at random points). Every claim checks on entry that the payload is
/// intact, older than its own token and not older than the newest successful write, and
/// that no successful write of its own happened after a newer claim had entered (a shared
/// word). For 6 s the parent SIGKILLs the current holder (and random workers), and
/// SIGSTOPs the holder for 5–120 ms (grace 40 ms), respawning the killed. Then every waiter
/// of every live process must get the lease twice more.
#[test]
fn guard_chaos_of_kills_and_stops_never_publishes_a_superseded_write_and_every_waiter_gets_the_lease()
 {
    cxc_testkit::play_role!(role_chaos);
    use std::sync::atomic::Ordering::SeqCst;
    let _s = serial();
    let mut rng = cxc_testkit::Rng::for_test();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let shared = dir.path().join("shared");
    let lease: OwnerLease<P6> = cxc_sync::LeaseBuilder::new(&path)
        .grace(Duration::from_millis(CHAOS_GRACE_MS))
        .create(chaos_value(0, 0))
        .unwrap();
    let w = words(&shared, C_WORDS);
    let seed = rng.seed();
    let spawn = |n: u64| -> Proc {
        RoleCommand::new(T4, "chaos")
            .arg("path", &path)
            .arg("shared", &shared)
            .arg("seed", (seed ^ n).to_string())
            .spawn()
    };
    let mut spawned = 0;
    let mut kids: Vec<Proc> = (0..3)
        .map(|_| {
            spawned += 1;
            spawn(spawned)
        })
        .collect();
    let (mut kills, mut holder_kills, mut stops, mut long_stops, mut waiter_stops) =
        (0, 0, 0, 0, 0);
    // The longest time the lease stayed vacant while workers waited for it (a lost
    // wake-up shows as a long vacancy; blocking waiters look again every 25 ms, async
    // ones at least every 100 ms).
    let monitor_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = std::thread::spawn({
        let path = path.clone();
        let monitor_stop = monitor_stop.clone();
        move || {
            let l: OwnerLease<P6> = OwnerLease::open(&path).unwrap();
            let mut longest = Duration::ZERO;
            let mut since: Option<Instant> = None;
            while !monitor_stop.load(SeqCst) {
                if l.current_owner().is_none() {
                    let s = *since.get_or_insert_with(Instant::now);
                    longest = longest.max(s.elapsed());
                } else {
                    since = None;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            longest
        }
    });
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(rng.range(10, 60)));
        let owner = lease.current_owner();
        let idx = owner.and_then(|o| kids.iter().position(|k| k.pid() == o));
        let roll = rng.below(100);
        if roll < 25 {
            let i = match idx {
                Some(i) => {
                    holder_kills += 1;
                    i
                }
                None => rng.below(kids.len() as u64) as usize,
            };
            kids[i].kill();
            kills += 1;
            spawned += 1;
            kids[i] = spawn(spawned);
        } else if roll < 35 {
            let i = rng.below(kids.len() as u64) as usize;
            kids[i].kill();
            kills += 1;
            spawned += 1;
            kids[i] = spawn(spawned);
        } else if roll < 65
            && let Some(i) = idx
        {
            let ms = rng.range(5, 120);
            if ms > CHAOS_GRACE_MS {
                long_stops += 1;
            }
            stops += 1;
            kids[i].stop();
            std::thread::sleep(Duration::from_millis(ms));
            kids[i].cont();
        } else if roll < 75 {
            // Any worker (a waiter, perhaps just woken), briefly.
            let i = rng.below(kids.len() as u64) as usize;
            waiter_stops += 1;
            kids[i].stop();
            std::thread::sleep(Duration::from_millis(rng.range(1, 30)));
            kids[i].cont();
        }
    }
    monitor_stop.store(true, SeqCst);
    let longest_vacancy = monitor.join().unwrap();
    let acq_chaos = w[C_ACQ].load(SeqCst);
    w[C_STOP].store(1, SeqCst);
    let t_end = Instant::now();
    for k in &mut kids {
        assert_eq!(
            k.next_report(Duration::from_secs(25)),
            "done",
            "a worker's waiters did not all get the lease after the chaos (lost wake-up?)"
        );
    }
    let fin = t_end.elapsed();
    for k in &mut kids {
        assert!(k.wait_timeout(Duration::from_secs(10)).is_some());
    }
    let snap: Vec<u64> = (0..C_WORDS).map(|i| w[i].load(SeqCst)).collect();
    println!(
        "seed {seed}: {spawned} workers, {kills} kills ({holder_kills} of the holder), {stops} \
         stops ({long_stops} past the grace), {waiter_stops} stops of any worker; longest \
         vacancy {longest_vacancy:?}; {acq_chaos} sections in the chaos, {} in all; \
         writes {} ok, {} lost, {} no-buffer; torn told {}; final rounds took {fin:?}; \
         max token {}; violations {} (first {:#x})",
        snap[C_ACQ],
        snap[C_WRITES],
        snap[C_LOST],
        snap[C_NOBUF],
        snap[C_TORN],
        snap[C_MAXGRANT],
        snap[C_VIOL],
        snap[C_FIRST]
    );
    assert_eq!(
        snap[C_VIOL],
        0,
        "violations (first code {})",
        snap[C_FIRST] >> 56
    );
    assert!(acq_chaos > 100, "too little happened: {acq_chaos} sections");
    assert!(
        longest_vacancy < Duration::from_millis(400),
        "the lease stayed vacant for {longest_vacancy:?} while workers waited"
    );
    assert!(stops > 5 && holder_kills > 5, "too little chaos");
    // Everything released: a guard of this process gets the lease, the payload is intact
    // and the newest successful write's or newer.
    let g = lease
        .lock_timeout(Duration::from_secs(2))
        .expect("the lease is free after every worker exited");
    let v = match g.read() {
        Ok(v) => v,
        Err(_) => {
            g.acknowledge_inconsistent();
            g.read().unwrap()
        }
    };
    assert!(cxc_testkit::intact(&v));
    assert!(v[0] >> 12 >= snap[C_MAXW] && v[0] >> 12 < g.token());
}

// ---------------------------------------------------------------------------------------
// 5. A guard claimed for another live process's pid (`LeaseBuilder::pid`).
// ---------------------------------------------------------------------------------------

const T5: &str = "guard_claimed_for_another_processs_pid_is_the_claiming_processs_alone";

/// Role: the process whose pid a guard of another process names; tries every call of
/// the seed, claims and guard layers on that claim, then blocks in `lock_timeout`.
fn role_named() {
    let lease: OwnerLease<u64> = manual_builder(&path_arg("path")).open().unwrap();
    report("named");
    cxc_testkit::child_wait_for_path(&path_arg("act"), Duration::from_secs(20));
    let mine = me();
    let am = lease.am_i_owner(mine);
    let read = lease.read_as_owner(mine).is_some();
    let write = lease.write_as_owner(mine, 666);
    let beat = lease.beat(mine);
    let release = lease.release(mine);
    let wl = lease.with_lease(mine, 1 << 40, |v| *v = 667).is_some();
    let tok = lease.current_claim().expect("held");
    let tok_pid = tok.pid();
    let rc = lease.release_claim(&tok);
    let wc = lease.write_claimed(&tok, 668);
    let bc = lease.beat_claimed(&tok);
    let claim = lease.try_claim(mine, 1 << 40).is_some();
    let try_lock = lease.try_lock().is_some();
    report(format!(
        "REFUSED am={am} read={read} write={write} beat={beat} release={release} \
         with_lease={wl} tok_pid={tok_pid} release_claim={rc} write_claimed={wc} \
         beat_claimed={bc} try_claim={claim} try_lock={try_lock}"
    ));
    let g = lease.lock_timeout(Duration::from_secs(15));
    let at = mono_ns();
    report(format!(
        "GOT got={} at_ns={at} token={} value={}",
        g.is_some(),
        g.as_ref().map_or(0, |g| g.token()),
        g.as_ref().map_or(0, |g| g.read().unwrap_or(0))
    ));
}

/// Role: locks a guard of a handle built with `.pid(target)`, writes 5, and holds it
/// (answering the parent's checks) until killed.
fn role_proxy() {
    let target: u32 = arg("target").parse().unwrap();
    let lease: OwnerLease<u64> = manual_builder(&path_arg("path"))
        .pid(target)
        .open()
        .unwrap();
    let g = lease.try_lock().expect("vacant");
    g.write(5).unwrap();
    report(format!("locked token={}", g.token()));
    cxc_testkit::child_wait_for_path(&path_arg("check"), Duration::from_secs(20));
    report(format!(
        "CHECK current={} read={} lost_now={}",
        g.is_current(),
        g.read().unwrap_or(0),
        g.wait_lost(Duration::from_millis(50))
    ));
    sleep_forever();
}

/// LeaseBuilder: "`pid`: The pid the guards' claims are made for (shown as the owner ...).
/// The claims always name this process's identity"; owner-lease.md: "A claim made for
/// another pid is the claiming process's: if the claiming process dies, its claim is
/// taken over at once, whatever the other pid does"; "A claim belongs to the process that
/// made it": no other process can "write, read, beat or release" with it; api.md: seed
/// calls "never see a guard's claim as theirs".
///
/// Process A locks a guard made for process B's pid (B alive). The owner shown is B; B's
/// seed calls for its own pid, the token `current_claim()` gives it, its `try_claim` and
/// `try_lock` are all refused, and A's guard is unaffected. A is SIGKILLed: B, blocked
/// in `lock_timeout` (manual epochs nobody ticks: only A's death can end the claim), gets
/// the lease at once with A's value, although the pid the claim was made for (B's) lives.
#[test]
fn guard_claimed_for_another_processs_pid_is_the_claiming_processs_alone() {
    cxc_testkit::play_role!(role_named, role_proxy);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lease");
    let (act, check) = (dir.path().join("act"), dir.path().join("check"));
    let lease: OwnerLease<u64> = manual_builder(&path).create(0).unwrap();
    let mut b = RoleCommand::new(T5, "named")
        .arg("path", &path)
        .arg("act", &act)
        .spawn();
    assert_eq!(b.next_report(REPORT_WAIT), "named");
    let mut a = RoleCommand::new(T5, "proxy")
        .arg("path", &path)
        .arg("check", &check)
        .arg("target", b.pid().to_string())
        .spawn();
    let locked = a.next_report(REPORT_WAIT);
    let a_token = num(&locked, "token");
    assert_eq!(lease.current_owner(), Some(b.pid()), "the owner shown is B");
    std::fs::write(&act, b"").unwrap();
    let refused = b.next_report(REPORT_WAIT);
    println!("B on A's guard claim made for B's pid: {refused}");
    assert_eq!(
        refused,
        format!(
            "REFUSED am=false read=false write=false beat=false release=false \
             with_lease=false tok_pid={} release_claim=false write_claimed=false \
             beat_claimed=false try_claim=false try_lock=false",
            b.pid()
        ),
        "the process whose pid a guard names acted on it"
    );
    std::fs::write(&check, b"").unwrap();
    let chk = a.next_report(REPORT_WAIT);
    assert_eq!(
        chk, "CHECK current=true read=5 lost_now=false",
        "A's guard was disturbed"
    );
    assert_eq!(lease.current_owner(), Some(b.pid()));
    std::thread::sleep(Duration::from_millis(100));
    let killed = mono_ns();
    a.kill();
    let got = b.next_report(REPORT_WAIT);
    let ms = num(&got, "at_ns").saturating_sub(killed) as f64 / 1e6;
    println!("B after A's SIGKILL: {got} ({ms:.2} ms)");
    assert!(got.contains("got=true"), "{got}");
    assert!(num(&got, "token") > a_token, "{got}");
    assert_eq!(num(&got, "value"), 5, "{got}");
    assert!(ms < 500.0, "B took A's claim over {ms} ms after A's death");
}
