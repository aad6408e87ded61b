#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack32: `SharedRwLock` promises (docs/shared-rwlock.md) not attacked before, with
//! real processes.
//!
//! 1. A reader and a writer process whose main thread exited *before* it first touched
//!    the lock (pidfs and fallback identity paths): kept while alive, reclaimed at once
//!    when dead.
//! 2. The same with their pids handed to such processes in a fresh pid namespace (root):
//!    the heirs inherit no read count and no write claim.
//! 3. A full holder table (2 slots) whose other slot belongs to a stopped writer evicted
//!    after the grace (its staging buffer quarantined): a newcomer is refused while the
//!    writer lives, admitted once it died or left, and no buffer stays quarantined (nine
//!    rounds, more than the eight buffers); pidfs and fallback paths.
//! 4. A writer (blocking and async) draining behind a long reader for several graces
//!    while a third process waits to write: never evicted, its write lands.
//! 5. A handle carried into another pid namespace (root): its async and blocking
//!    waiters have no holder slot and must wait idle.
//! 6. Seeded SIGKILL/SIGSTOP chaos over five worker kinds (plain, main thread exited
//!    first, fallback identity, async, both) with an independent detector: the kernel's
//!    `flock` on a separate file, shared in read sections, exclusive in write sections.
//! 7. Timed waits with gaps of more than 100 ms do not add up to an eviction.

mod procs;

use std::fs::OpenOptions;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use cxc_mmf::identity::Identity;
use cxc_sync::{RwLockError, RwLockOptions, SharedRwLock};
use cxc_testkit::{
    Proc, Rng, RoleCommand, arg, child_wait_for_path, exit_main_thread, flag, intact, mono_ns, num,
    path_arg, play_role, read_word, report, sealed, serial, sleep_forever, wait_until,
};

const REPORT_WAIT: Duration = Duration::from_secs(20);
const CHILD_DEADLINE: Duration = Duration::from_secs(30);

/// The rwlock's state word: file offset 128 (docs/shared-rwlock.md, "Memory layout").
fn state_word(path: &Path) -> u64 {
    read_word(path, 128)
}

/// `WRITER` (bits 0..10).
fn writer_of(w: u64) -> u64 {
    w & 0x3FF
}

/// `Q` (bits 16..24).
fn quarantined(w: u64) -> u64 {
    (w >> 16) & 0xFF
}

fn counter(lock: &SharedRwLock<u64>, name: &str) -> u64 {
    lock.counters()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// 1. Main thread exited before the first use of the lock.
// ---------------------------------------------------------------------------------------

/// Role: ends its main thread, then opens the lock and takes a read hold (`mode=read`)
/// or the write lock and writes 7 (`mode=write`), and lives on until killed.
fn role_late() {
    assert!(exit_main_thread(), "the main thread did not exit");
    let lock: &'static SharedRwLock<u64> =
        Box::leak(Box::new(SharedRwLock::open(path_arg("path")).unwrap()));
    let id = Identity::current();
    match arg("mode").as_str() {
        "read" => std::mem::forget(lock.try_read().expect("free")),
        _ => {
            let w = lock.try_write().expect("free");
            w.write(7).unwrap();
            std::mem::forget(w);
        }
    }
    report(format!(
        "HELD known={} unique={:#x}",
        id.is_known(),
        id.unique
    ));
    sleep_forever();
}

fn late_half_scenario(test: &str, fallback: bool) {
    play_role!(role_late);
    let _s = serial();
    for mode in ["read", "write"] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("rw");
        let opts = RwLockOptions::default().grace(Duration::from_secs(10));
        let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
        let mut cmd = RoleCommand::new(test, "late")
            .arg("path", &path)
            .arg("mode", mode);
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut kid: Proc = cmd.spawn();
        let line = kid.next_report(REPORT_WAIT);
        eprintln!("fallback={fallback} mode={mode} child: {line}");
        assert!(flag(&line, "known"), "identity unknown: {line}");
        assert_eq!(kid.state(), Some('Z'), "the main thread exited");
        let snap = SharedRwLock::inspect(&path).unwrap();
        if mode == "read" {
            let counted: u64 = snap
                .holders
                .iter()
                .filter(|h| h.pid == kid.pid())
                .map(|h| h.readers)
                .sum();
            assert_eq!(counted, 1, "its read hold is counted in its slot");
            assert!(
                lock.write_timeout(Duration::from_millis(600)).is_none(),
                "fallback={fallback}: a writer got in beside a live late-half-exited reader"
            );
        } else {
            assert_eq!(
                snap.writer.map(|w| w.1),
                Some(kid.pid()),
                "it is the writer"
            );
            assert!(
                lock.read_timeout(Duration::from_millis(600)).is_none(),
                "fallback={fallback}: a reader got in beside a live late-half-exited writer"
            );
        }
        assert_eq!(
            lock.reclaim_dead(),
            0,
            "fallback={fallback} mode={mode}: a live holder was reclaimed ({line})"
        );
        kid.kill();
        let t = Instant::now();
        if mode == "read" {
            let g = lock.write_timeout(Duration::from_secs(3));
            assert!(
                g.is_some(),
                "fallback={fallback}: the dead late-half-exited reader wedged the writer ({line})"
            );
        } else {
            let r = lock.read_timeout(Duration::from_secs(3)).unwrap_or_else(|| {
                panic!("fallback={fallback}: the dead late-half-exited writer was never evicted ({line})")
            });
            assert_eq!(r.get(), 7, "its complete published write");
        }
        let took = t.elapsed();
        eprintln!("fallback={fallback} mode={mode}: in {took:?} after the kill");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}

/// "Readers and the writer are tracked by process identity ..., so a process that dies
/// holding the lock (read or write) is reclaimed by the next waiter"; "Dead reader ...
/// (pidfd//proc identity check, as the semaphore: whole thread group gone or pid
/// reused)" — for processes whose main thread exited before they first used the lock
/// (pidfs path).
#[test]
fn rwlock_holders_registered_after_their_main_thread_exited_are_kept_then_reclaimed() {
    late_half_scenario(
        "rwlock_holders_registered_after_their_main_thread_exited_are_kept_then_reclaimed",
        false,
    );
}

/// As above, on the fallback identity path (pid + start time).
#[test]
fn rwlock_holders_registered_after_their_main_thread_exited_are_kept_then_reclaimed_fallback() {
    late_half_scenario(
        "rwlock_holders_registered_after_their_main_thread_exited_are_kept_then_reclaimed_fallback",
        true,
    );
}

// ---------------------------------------------------------------------------------------
// 2. Their pids handed to late-half-exited heirs (root, new pid namespace).
// ---------------------------------------------------------------------------------------

fn late_reuse(test: &str, fallback: bool) {
    match procs::role().as_deref() {
        Some("nsroot") => procs::nsroot(test),
        Some("scenario") => late_reuse_scenario(test, fallback),
        Some("holder") => {
            assert!(exit_main_thread(), "the main thread did not exit");
            let lock: &'static SharedRwLock<u64> = Box::leak(Box::new(
                SharedRwLock::open(procs::dir().join("rw")).unwrap(),
            ));
            if arg("mode") == "read" {
                std::mem::forget(lock.try_read().expect("free"));
            } else {
                let w = lock.try_write().expect("free");
                w.write(7).unwrap();
                std::mem::forget(w);
            }
            report("HELD");
            sleep_forever();
        }
        Some("heir") => {
            assert!(exit_main_thread(), "the main thread did not exit");
            let lock: &'static SharedRwLock<u64> = Box::leak(Box::new(
                SharedRwLock::open(procs::dir().join("rw")).unwrap(),
            ));
            let me = std::process::id();
            let snap = SharedRwLock::inspect(procs::dir().join("rw")).unwrap();
            let mut mine: Vec<u64> = snap
                .holders
                .iter()
                .filter(|h| h.pid == me)
                .map(|h| h.readers)
                .collect();
            mine.sort_unstable();
            let t = Instant::now();
            let line = if arg("mode") == "read" {
                // Its own slot counts nothing; the dead reader's count must be reclaimed,
                // not taken for the heir's own hold (a writer drains every slot).
                let got = lock.write_timeout(Duration::from_secs(3)).map(|w| {
                    let ok = w.write(9).is_ok();
                    ok && w.unlock().is_ok()
                });
                format!("RESULT slots={mine:?} got={got:?}")
            } else {
                // The dead writer's claim must not be the heir's: a reader evicts it at
                // once (else it waits for the grace of 20 s).
                let v = lock.read_timeout(Duration::from_secs(3)).map(|r| r.get());
                let w = lock
                    .write_timeout(Duration::from_secs(1))
                    .map(|w| w.write(8).is_ok() && w.unlock().is_ok());
                format!("RESULT slots={mine:?} read={v:?} wrote={w:?}")
            };
            report(format!("{line} ms={}", t.elapsed().as_millis()));
            sleep_forever();
        }
        Some(other) => panic!("unknown role {other}"),
        None => procs::run_reuse_test(test, fallback),
    }
}

fn late_reuse_scenario(test: &str, fallback: bool) {
    procs::mount_own_proc();
    assert_eq!(cxc_sync::liveness::fallback_active(), fallback);
    let opts = RwLockOptions::default()
        .holders(8)
        .grace(Duration::from_secs(20));
    let lock = SharedRwLock::<u64>::create_with(procs::dir().join("rw"), 0, &opts).unwrap();
    let mut heirs = Vec::new();
    for mode in ["read", "write"] {
        let mut holder = procs::spawn(test, "holder", &procs::dir(), &[("mode", mode)]);
        procs::wait_line(&mut holder, "HELD");
        let hpid = holder.pid();
        holder.kill();
        // Past the fallback path's same-tick window.
        std::thread::sleep(Duration::from_millis(30));
        let mut heir = procs::spawn_with_pid(hpid, test, "heir", &[("mode", mode)]);
        let line = procs::wait_line(&mut heir, "RESULT");
        eprintln!("fallback={fallback} mode={mode} heir (pid {hpid}): {line}");
        let line = line.rsplit_once(" ms=").unwrap().0.to_string();
        let want = if mode == "read" {
            "RESULT slots=[0, 1] got=Some(true)"
        } else {
            "RESULT slots=[0, 0] read=Some(7) wrote=Some(true)"
        };
        assert_eq!(
            line, want,
            "mode={mode}: a late-half-exited process given a dead late-half-exited holder's \
             pid inherited its read count or its write claim"
        );
        heirs.push(heir);
    }
    let r = lock.read_timeout(Duration::from_secs(1)).expect("free");
    assert_eq!(r.get(), 8);
}

/// "pid reused ... is taken over, its count zeroed"; "Dead writer: waiters see `WRITER`
/// naming a slot whose process is gone and evict it at once" — the dead holders and the
/// heirs that got their pids all ended their main thread before first using the lock
/// (pidfs path).
#[test]
fn rwlock_late_half_exited_heirs_of_dead_holders_pids_inherit_no_hold() {
    late_reuse(
        "rwlock_late_half_exited_heirs_of_dead_holders_pids_inherit_no_hold",
        false,
    );
}

/// As above, on the fallback identity path (pid + start time).
#[test]
fn rwlock_late_half_exited_heirs_of_dead_holders_pids_inherit_no_hold_fallback() {
    late_reuse(
        "rwlock_late_half_exited_heirs_of_dead_holders_pids_inherit_no_hold_fallback",
        true,
    );
}

// ---------------------------------------------------------------------------------------
// 3. A full table whose other slot is an evicted writer's (quarantine record).
// ---------------------------------------------------------------------------------------

/// Role: takes the write lock, publishes `val`, reports, then (when continued after its
/// eviction) waits for `go`, tries to write 666 through its lost guard, drops it, exits.
fn role_stall_writer() {
    let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
    let val: u64 = arg("val").parse().unwrap();
    let w = lock.write_timeout(Duration::from_secs(5)).expect("free");
    w.write(val).unwrap();
    report(format!("HELD token={}", w.token()));
    child_wait_for_path(&path_arg("go"), Duration::from_secs(30));
    let res = w.write(666);
    let current = w.is_current();
    drop(w);
    report(format!("LOST write_err={} current={current}", res.is_err()));
}

/// Role: opens the lock (reports how), writes `val` if it could.
fn role_newcomer() {
    match SharedRwLock::<u64>::open(path_arg("path")) {
        Ok(lock) => {
            let val: u64 = arg("val").parse().unwrap();
            let wrote = lock
                .write_timeout(Duration::from_secs(3))
                .is_some_and(|w| w.write(val).is_ok() && w.unlock().is_ok());
            report(format!("open=ok wrote={wrote}"));
        }
        Err(RwLockError::TableFull { capacity }) => {
            report(format!("open=table_full capacity={capacity}"));
        }
        Err(e) => report(format!("open=error {e}")),
    }
}

/// Scenario (a child, so that the fallback variant runs entirely on that path).
fn role_full_scenario() {
    let test = arg("test");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.rw");
    let grace = Duration::from_millis(200);
    let opts = RwLockOptions::default().holders(2).grace(grace);
    let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
    let newcomer = |val: u64| {
        RoleCommand::new(&test, "newcomer")
            .arg("path", &path)
            .arg("val", val.to_string())
            .spawn()
            .finish(CHILD_DEADLINE)
            .last()
            .cloned()
            .unwrap()
    };
    for round in 0..9u64 {
        let go = dir.path().join(format!("go{round}"));
        let mut w = RoleCommand::new(&test, "stall_writer")
            .arg("path", &path)
            .arg("val", (1000 + round).to_string())
            .arg("go", &go)
            .spawn();
        let held = w.next_report(REPORT_WAIT);
        assert!(held.starts_with("HELD"), "round {round}: {held}");
        w.stop();
        w.wait_state('T', Duration::from_secs(5));
        let t = Instant::now();
        let g = lock
            .write_timeout(Duration::from_secs(3))
            .expect("the stopped writer is evicted after the grace");
        let took = t.elapsed();
        assert!(took >= grace, "evicted before the grace: {took:?}");
        assert_eq!(g.read().unwrap(), 1000 + round, "its complete write");
        assert_ne!(
            quarantined(state_word(&path)),
            0,
            "round {round}: its staging buffer is quarantined"
        );
        g.write(round).unwrap();
        g.unlock().unwrap();
        // The table is full of live processes (us and the stopped writer).
        let refused = newcomer(5000 + round);
        assert_eq!(
            refused, "open=table_full capacity=2",
            "round {round}: a newcomer was not refused by a full table of live processes"
        );
        if round % 2 == 0 {
            w.kill();
        } else {
            std::fs::write(&go, b"go").unwrap();
            w.cont();
            let lost = w.next_report(REPORT_WAIT);
            assert_eq!(
                lost, "LOST write_err=true current=false",
                "round {round}: the evicted writer's guard still worked"
            );
            let st = w.wait_timeout(CHILD_DEADLINE).expect("it exits");
            assert!(st.success());
        }
        // Its slot is dead now (killed, or exited), maybe still named by a quarantine
        // record: a newcomer must get in and write.
        let line = newcomer(2000 + round);
        let word = state_word(&path);
        eprintln!(
            "round {round}: evicted in {took:?}; newcomer: {line}; Q={:#x}",
            quarantined(word)
        );
        assert_eq!(
            line, "open=ok wrote=true",
            "round {round}: a newcomer was refused though the evicted writer's process is gone"
        );
        assert_eq!(
            quarantined(word),
            0,
            "round {round}: a buffer stayed quarantined after its writer was gone"
        );
        let r = lock.read_timeout(Duration::from_secs(1)).expect("free");
        assert_eq!(r.get(), 2000 + round, "round {round}: the newcomer's write");
    }
    report(format!(
        "DONE freed={} reaped={} evicted_stale={} stale_rejected={}",
        counter(&lock, "quarantine_freed"),
        counter(&lock, "quarantine_reaped"),
        counter(&lock, "evicted_stale"),
        counter(&lock, "stale_rejected")
    ));
}

fn full_table_test(test: &str, fallback: bool) {
    play_role!(role_full_scenario, role_stall_writer, role_newcomer);
    let _s = serial();
    let mut cmd = RoleCommand::new(test, "full_scenario").arg("test", test);
    if fallback {
        cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
    }
    let out = cmd.spawn().output(Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "fallback={fallback}: {}\n{stdout}{stderr}",
        out.status
    );
    let done = stdout
        .lines()
        .find_map(|l| l.split_once("DONE ").map(|(_, r)| r.to_string()))
        .unwrap_or_else(|| panic!("no DONE line: {stdout}"));
    println!("fallback={fallback}: {done}");
    // Nine evictions; the four continued writers freed their own buffers, the five
    // killed ones' buffers were reaped.
    assert_eq!(num(&done, "evicted_stale"), 9, "{done}");
    assert_eq!(num(&done, "freed") + num(&done, "reaped"), 9, "{done}");
}

/// "A full table of live processes is refused at `open` with `RwLockError::TableFull`
/// (dead holders are reclaimed first)"; "Stopped (or slow) writer ... it evicts the
/// writer"; "Fencing: ... Its staging buffer was quarantined at eviction ...; it frees
/// the buffer itself when it learns of the loss, or `reap_quarantine` frees it once its
/// process is dead" — the only other slot of a 2-slot table belongs to an evicted writer
/// named by a quarantine record; nine rounds (pidfs path).
#[test]
fn rwlock_full_table_with_an_evicted_writers_quarantine_admits_newcomers_once_it_is_gone() {
    full_table_test(
        "rwlock_full_table_with_an_evicted_writers_quarantine_admits_newcomers_once_it_is_gone",
        false,
    );
}

/// As above, on the fallback identity path (pid + start time).
#[test]
fn rwlock_full_table_with_an_evicted_writers_quarantine_admits_newcomers_once_it_is_gone_fallback()
{
    full_table_test(
        "rwlock_full_table_with_an_evicted_writers_quarantine_admits_newcomers_once_it_is_gone_fallback",
        true,
    );
}

// ---------------------------------------------------------------------------------------
// 4. A draining writer and a third waiter.
// ---------------------------------------------------------------------------------------

/// Role: holds a read lock for `hold_ms`, then reports when it left.
fn role_long_reader() {
    let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
    let hold: u64 = arg("hold_ms").parse().unwrap();
    let g = lock.try_read().expect("free");
    report("HELD");
    std::thread::sleep(Duration::from_millis(hold));
    let at = mono_ns();
    drop(g);
    report(format!("RELEASED at={at}"));
}

/// Role: on `go`, takes the write lock (`write` or `write_async`), writes 42, holds it
/// 50 ms, unlocks; reports.
fn role_drainer() {
    let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
    child_wait_for_path(&path_arg("go"), Duration::from_secs(30));
    let asynchronous = arg("mode") == "async";
    let g = if asynchronous {
        async_write(&lock)
    } else {
        lock.write_timeout(Duration::from_secs(10))
            .expect("the drainer never got in")
    };
    let at = mono_ns();
    let current = g.is_current();
    let wrote = g.write(42).is_ok();
    let token = g.token();
    std::thread::sleep(Duration::from_millis(50));
    let unlocked = g.unlock().is_ok();
    report(format!(
        "GOT at={at} token={token} current={current} wrote={wrote} unlocked={unlocked}"
    ));
}

#[cfg(feature = "async")]
fn async_write(lock: &SharedRwLock<u64>) -> cxc_sync::WriteGuard<'_, u64> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(10), lock.write_async())
                .await
                .expect("the async drainer never got in")
        })
}

#[cfg(not(feature = "async"))]
fn async_write(_lock: &SharedRwLock<u64>) -> cxc_sync::WriteGuard<'_, u64> {
    unreachable!("async mode needs the async feature")
}

fn drain_scenario(test: &str, mode: &str) {
    play_role!(role_long_reader, role_drainer);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("drain.rw");
    let grace = Duration::from_millis(250);
    let opts = RwLockOptions::default().grace(grace);
    let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
    let mut reader = RoleCommand::new(test, "long_reader")
        .arg("path", &path)
        .arg("hold_ms", "1500")
        .spawn();
    assert_eq!(reader.next_report(REPORT_WAIT), "HELD");
    let go = dir.path().join("go");
    let mut drainer = RoleCommand::new(test, "drainer")
        .arg("path", &path)
        .arg("go", &go)
        .arg("mode", mode)
        .spawn();
    std::fs::write(&go, b"go").unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || writer_of(state_word(&path)) != 0),
        "the drainer never claimed"
    );
    let claim_token = state_word(&path) >> 24;
    // A third process's writer waits behind the draining one for about 6 graces.
    let t = Instant::now();
    let g = lock
        .write_timeout(Duration::from_secs(8))
        .expect("the third writer never got in");
    let waited = t.elapsed();
    let seen = g.read().unwrap();
    let my_token = g.token();
    drop(g);
    let rel = reader.next_report(REPORT_WAIT);
    let got = drainer.next_report(REPORT_WAIT);
    let stale = counter(&lock, "evicted_stale");
    println!(
        "mode={mode}: third writer waited {waited:?}, saw {seen} token {my_token}; claim token \
         {claim_token}; reader {rel}; drainer {got}; evicted_stale={stale}"
    );
    assert_eq!(
        (
            flag(&got, "current"),
            flag(&got, "wrote"),
            flag(&got, "unlocked")
        ),
        (true, true, true),
        "mode={mode}: the draining writer was evicted (waited behind a long reader): {got}"
    );
    assert_eq!(
        stale, 0,
        "mode={mode}: a writer draining behind a reader was evicted as stalled"
    );
    assert_eq!(
        num(&got, "token"),
        claim_token,
        "its first claim held: {got}"
    );
    assert!(num(&got, "at") >= num(&rel, "at"), "in beside the reader");
    assert_eq!(seen, 42, "the third writer came after the drainer's write");
    assert!(my_token > claim_token);
}

/// "a writer waiting for readers beats every 20 ms by itself, so it is not evicted while
/// draining"; "Writer preference ... the writer gets in after the longest current read
/// section" — a reader holds for 6 graces, a blocking writer drains behind it, and a
/// third process's writer waits the whole time.
#[test]
fn rwlock_blocking_writer_draining_for_many_graces_is_not_evicted_by_a_third_waiter() {
    drain_scenario(
        "rwlock_blocking_writer_draining_for_many_graces_is_not_evicted_by_a_third_waiter",
        "sync",
    );
}

/// (Async) "and the writer that installed its claim and waits for readers to leave ...
/// it beats at each reactor tick, 25 ms, so waiters do not evict it" — as above with a
/// `write_async` drainer.
#[cfg(feature = "async")]
#[test]
fn rwlock_async_writer_draining_for_many_graces_is_not_evicted_by_a_third_waiter() {
    drain_scenario(
        "rwlock_async_writer_draining_for_many_graces_is_not_evicted_by_a_third_waiter",
        "async",
    );
}

// ---------------------------------------------------------------------------------------
// 5. Waiters of a handle carried into another pid namespace (root).
// ---------------------------------------------------------------------------------------

#[cfg(feature = "async")]
mod foreign {
    use std::future::Future;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::task::{Context, Wake, Waker};

    use super::*;

    #[derive(Default)]
    struct Count(AtomicU64);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Polls `fut` whenever it was woken (else looks every 2 ms, so that this loop's own
    /// CPU stays small) for `t`: (completed, wake-ups).
    fn drive_for<F: Future>(fut: F, t: Duration) -> (bool, u64) {
        let count = Arc::new(Count::default());
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        let mut fut = Box::pin(fut);
        if fut.as_mut().poll(&mut cx).is_ready() {
            return (true, 0);
        }
        let until = Instant::now() + t;
        let mut seen = 0;
        while Instant::now() < until {
            let now = count.0.load(Ordering::SeqCst);
            if now == seen {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            seen = now;
            if fut.as_mut().poll(&mut cx).is_ready() {
                return (true, seen);
            }
        }
        (false, count.0.load(Ordering::SeqCst))
    }

    fn role_carrier() {
        let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
        drop(lock.try_read().expect("free"));
        // SAFETY: unshare(CLONE_NEWPID) only changes the pid namespace of this thread's
        // future children.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWPID) }, 0);
        // SAFETY: the child only makes lock calls, reports and `_exit`s.
        let child = unsafe { libc::fork() };
        if child == 0 {
            let pid1 = std::process::id() == 1;
            let none = lock.try_read().is_none() && lock.try_write().is_none();
            let c0 = cxc_testkit::process_cpu();
            let (r, r_wakes) = drive_for(lock.read_async(), Duration::from_secs(1));
            let r_cpu = cxc_testkit::process_cpu() - c0;
            let c0 = cxc_testkit::process_cpu();
            let (w, w_wakes) = drive_for(lock.write_async(), Duration::from_secs(1));
            let w_cpu = cxc_testkit::process_cpu() - c0;
            let c0 = cxc_testkit::process_cpu();
            let b = lock.read_timeout(Duration::from_secs(1)).is_some();
            let b_cpu = cxc_testkit::process_cpu() - c0;
            report(format!(
                "CHILD pid1={pid1} none={none} read_got={r} read_wakes={r_wakes} \
                 read_cpu_ms={} write_got={w} write_wakes={w_wakes} write_cpu_ms={} \
                 blocking_got={b} blocking_cpu_ms={}",
                r_cpu.as_millis(),
                w_cpu.as_millis(),
                b_cpu.as_millis()
            ));
            // SAFETY: ends the forked child without the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        report("PARENT done");
    }

    const CARRIED: &str =
        "foreign::rwlock_waiters_of_a_handle_carried_into_another_pid_namespace_wait_idle";

    /// "a handle carried into another namespace (`unshare` + `fork`) cannot register
    /// there (`try_read`/`try_write` give `None`)"; docs/async.md, no busy waiting; "a
    /// forked child that finds the table full ... waits in `read`/`write` (asleep ...; an
    /// async waiter likewise)" — a process without a holder slot for another reason: its
    /// `read_async`, `write_async` (each driven 1 s) and `read_timeout(1 s)` must not
    /// complete and must use at most 10 % of a core.
    #[test]
    fn rwlock_waiters_of_a_handle_carried_into_another_pid_namespace_wait_idle() {
        play_role!(role_carrier);
        if procs::skip_unless_root(CARRIED) {
            return;
        }
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("carried.rw");
        let opts = RwLockOptions::default().grace(Duration::from_secs(10));
        let _lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
        let mut kid = RoleCommand::new(CARRIED, "carrier")
            .arg("path", &path)
            .spawn();
        let reps = kid.finish(CHILD_DEADLINE);
        let line = reps.iter().find(|l| l.starts_with("CHILD")).unwrap();
        println!("{line}");
        assert!(flag(line, "pid1") && flag(line, "none"), "{line}");
        assert!(
            !flag(line, "read_got") && !flag(line, "write_got") && !flag(line, "blocking_got"),
            "a process in a foreign pid namespace got a hold: {line}"
        );
        assert!(
            num(line, "read_cpu_ms") <= 100
                && num(line, "write_cpu_ms") <= 100
                && num(line, "blocking_cpu_ms") <= 100
                && num(line, "read_wakes") <= 200
                && num(line, "write_wakes") <= 200,
            "waiters without a holder slot (foreign pid namespace) spun: {line}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 6. Chaos with the kernel's flock as the independent detector.
// ---------------------------------------------------------------------------------------

type Payload = [u64; 6];

fn log_line(log: &Path, line: &str) {
    let mut f = OpenOptions::new().append(true).open(log).unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// `flock(fd, op | LOCK_NB)`: whether it was granted.
fn flock_nb(fd: i32, op: i32) -> bool {
    // SAFETY: flock on a file descriptor this process owns.
    unsafe { libc::flock(fd, op | libc::LOCK_NB) == 0 }
}

fn spin_us(us: u64) {
    let until = Instant::now() + Duration::from_micros(us);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Role: a chaos worker of kind `kind` (`plain`, `late`, `async`, `late_async`; the
/// fallback identity path comes from the environment).
fn role_chaos() {
    let kind = arg("kind");
    if kind.starts_with("late") {
        assert!(exit_main_thread(), "the main thread did not exit");
    }
    let asynchronous = kind.ends_with("async");
    let lock: &'static SharedRwLock<Payload> =
        Box::leak(Box::new(SharedRwLock::open(path_arg("path")).unwrap()));
    let det = std::fs::File::open(path_arg("det")).unwrap();
    let fd = det.as_raw_fd();
    let log = path_arg("log");
    let stop = path_arg("stop");
    let id: u64 = arg("id").parse().unwrap();
    let mut rng = Rng::new(arg("seed").parse().unwrap());
    #[cfg(feature = "async")]
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    report("ready");
    let (mut reads, mut writes, mut lost) = (0u64, 0u64, 0u64);
    let mut n = 0u64;
    while !stop.exists() {
        n += 1;
        if rng.percent(40) {
            let g = if asynchronous {
                #[cfg(feature = "async")]
                {
                    rt.block_on(lock.write_async())
                }
                #[cfg(not(feature = "async"))]
                {
                    lock.write()
                }
            } else {
                lock.write()
            };
            if !flock_nb(fd, libc::LOCK_EX) {
                log_line(&log, &format!("V write id={id} kind={kind} n={n}"));
            }
            match g.read() {
                Ok(v) if !intact(&v) => log_line(&log, &format!("T id={id} n={n}")),
                _ => {}
            }
            let v = (id << 48) | n;
            spin_us(rng.below(300));
            if g.write(sealed(v)).is_err() {
                lost += 1;
            }
            spin_us(rng.below(100));
            flock_nb(fd, libc::LOCK_UN);
            drop(g);
            writes += 1;
        } else {
            let g = if asynchronous {
                #[cfg(feature = "async")]
                {
                    rt.block_on(lock.read_async())
                }
                #[cfg(not(feature = "async"))]
                {
                    lock.read()
                }
            } else {
                lock.read()
            };
            if !flock_nb(fd, libc::LOCK_SH) {
                log_line(&log, &format!("V read id={id} kind={kind} n={n}"));
            }
            if !intact(&g.get()) {
                log_line(&log, &format!("T id={id} n={n}"));
            }
            spin_us(rng.below(400));
            flock_nb(fd, libc::LOCK_UN);
            drop(g);
            reads += 1;
        }
        if n.is_multiple_of(64) {
            log_line(
                &log,
                &format!("P kind={kind} reads={reads} writes={writes}"),
            );
            (reads, writes) = (0, 0);
        }
    }
    log_line(
        &log,
        &format!("P kind={kind} reads={reads} writes={writes} lost={lost}"),
    );
}

const CHAOS: &str = "rwlock_seeded_kill_and_stop_chaos_never_breaks_exclusion_under_flock";

/// "many readers or one writer across processes"; "a process that dies holding the lock
/// (read or write) is reclaimed by the next waiter and never blocks the lock forever";
/// "The published buffer is always complete" — five worker processes (plain, main
/// thread exited before first use, fallback identity, async, main thread exited + async +
/// fallback), seeded SIGKILL (respawned) and short SIGSTOPs (well under the 3 s grace, so
/// no eviction is due) for 7 s, half of the picks aimed at the current writer. Independent detector: each section takes the kernel's
/// `flock` on another file without blocking (shared for reads, exclusive for writes),
/// which the kernel drops when a process dies; a refused `flock` is an overlap.
#[test]
fn rwlock_seeded_kill_and_stop_chaos_never_breaks_exclusion_under_flock() {
    play_role!(role_chaos);
    let _s = serial();
    let mut rng = Rng::for_test();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("chaos.rw");
    let det = dir.path().join("detector");
    let log = dir.path().join("log");
    let stop = dir.path().join("stop");
    std::fs::write(&det, b"").unwrap();
    std::fs::write(&log, b"").unwrap();
    let opts = RwLockOptions::default().grace(Duration::from_secs(3));
    let lock = SharedRwLock::<Payload>::create_with(&path, sealed(0), &opts).unwrap();
    let kinds = [
        ("plain", false),
        ("late", false),
        ("plain", true),
        ("async", false),
        ("late_async", true),
    ];
    let mut next_id = 1u64;
    let mut spawn = |i: usize, rng: &mut Rng| {
        let (kind, fallback) = kinds[i];
        let mut cmd = RoleCommand::new(CHAOS, "chaos")
            .arg("path", &path)
            .arg("det", &det)
            .arg("log", &log)
            .arg("stop", &stop)
            .arg("kind", kind)
            .arg("id", next_id.to_string())
            .arg("seed", rng.next_u64().to_string());
        next_id += 1;
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        // Its "ready" is taken before it is next picked (spawns overlap other events).
        (cmd.spawn(), false)
    };
    let mut workers: Vec<(Proc, bool)> = (0..kinds.len()).map(|i| spawn(i, &mut rng)).collect();
    let mut last_stop = vec![Instant::now() - Duration::from_secs(1); kinds.len()];
    let (mut kills, mut stops) = (0u32, 0u32);
    let until = Instant::now() + Duration::from_secs(7);
    let mut writer_kills = 0u32;
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(rng.range(10, 60)));
        let mut i = rng.below(kinds.len() as u64) as usize;
        // Half of the picks go to the current writer, if any.
        let writer = SharedRwLock::inspect(&path).ok().and_then(|s| s.writer);
        if let Some((_, pid)) = writer
            && rng.percent(50)
            && let Some(k) = workers.iter().position(|w| w.0.pid() == pid)
        {
            i = k;
        }
        let (w, ready) = &mut workers[i];
        if !*ready {
            assert_eq!(w.next_report(REPORT_WAIT), "ready");
            *ready = true;
        }
        if rng.percent(50) {
            writer_kills += u32::from(writer.is_some_and(|(_, pid)| pid == w.pid()));
            w.kill();
            kills += 1;
            workers[i] = spawn(i, &mut rng);
        } else if last_stop[i].elapsed() > Duration::from_millis(500) {
            w.stop();
            std::thread::sleep(Duration::from_millis(rng.range(10, 150)));
            w.cont();
            last_stop[i] = Instant::now();
            stops += 1;
        }
    }
    std::fs::write(&stop, b"stop").unwrap();
    for (w, _) in &mut workers {
        w.finish(CHILD_DEADLINE);
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let violations: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("V ") || l.starts_with("T "))
        .collect();
    let mut per_kind = std::collections::BTreeMap::<String, (u64, u64)>::new();
    for l in text.lines().filter(|l| l.starts_with("P ")) {
        let kind = l
            .split_whitespace()
            .find_map(|f| f.strip_prefix("kind="))
            .unwrap()
            .to_string();
        let e = per_kind.entry(kind).or_default();
        e.0 += num(l, "reads");
        e.1 += num(l, "writes");
    }
    let stats = lock.stats();
    println!(
        "seed {:#x}: {kills} kills ({writer_kills} of the writer), {stops} stops; sections per kind {per_kind:?}; {:?}",
        rng.seed(),
        lock.counters()
    );
    assert!(
        violations.is_empty(),
        "exclusion broken (flock refused inside a section) or torn: {violations:?}"
    );
    for kind in ["plain", "late", "async", "late_async"] {
        let (r, w) = per_kind.get(kind).copied().unwrap_or_default();
        assert!(r > 0 && w > 0, "no progress for kind {kind}: {per_kind:?}");
    }
    assert_eq!(
        stats.evicted_stale, 0,
        "a writer stopped for at most 150 ms was evicted (grace 3 s)"
    );
    let g = lock
        .write_timeout(Duration::from_secs(3))
        .expect("the lock is free at the end");
    assert!(intact(&g.read().unwrap()));
}

// ---------------------------------------------------------------------------------------
// 7. Timed waits far apart do not add up.
// ---------------------------------------------------------------------------------------

/// Role: takes the write lock and holds it without progress until killed.
fn role_idle_writer() {
    let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
    let w = lock.try_write().expect("free");
    w.write(3).unwrap();
    report(format!("HELD token={}", w.token()));
    std::mem::forget(w);
    sleep_forever();
}

const SPARSE: &str = "rwlock_timed_waits_more_than_100ms_apart_do_not_add_up_to_an_eviction";

/// "The observation is kept in the handle, so timed waits in a row (each shorter than
/// the grace ...) add up like one long wait; a look more than 100 ms after the previous
/// one starts it over." A writer process holds the lock without progress (stopped);
/// grace 300 ms. Twelve `read_timeout(60 ms)` calls 200 ms apart (720 ms of waiting,
/// 3 s of wall time) must not evict it; then 50 ms timed waits back to back must, after
/// at least the grace.
#[test]
fn rwlock_timed_waits_more_than_100ms_apart_do_not_add_up_to_an_eviction() {
    play_role!(role_idle_writer);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.rw");
    let grace = Duration::from_millis(300);
    let opts = RwLockOptions::default().grace(grace);
    let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
    let mut w = RoleCommand::new(SPARSE, "idle_writer")
        .arg("path", &path)
        .spawn();
    let held = w.next_report(REPORT_WAIT);
    w.stop();
    w.wait_state('T', Duration::from_secs(5));
    for i in 0..12 {
        assert!(
            lock.read_timeout(Duration::from_millis(60)).is_none(),
            "wait {i}: the stopped writer ({held}) was evicted by sparse short waits"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(counter(&lock, "evicted_stale"), 0);
    let t = Instant::now();
    let mut got = None;
    while t.elapsed() < Duration::from_secs(8) {
        if let Some(r) = lock.read_timeout(Duration::from_millis(50)) {
            got = Some(r.get());
            break;
        }
    }
    let took = t.elapsed();
    println!("sparse waits: no eviction; back-to-back waits evicted after {took:?}");
    assert_eq!(got, Some(3), "back-to-back waits never evicted it");
    // No upper bound but the loop's: on a loaded machine a late wake-up (a look more
    // than 100 ms after the previous one) starts the observation over, as documented.
    assert!(took >= grace, "{took:?}");
    assert_eq!(counter(&lock, "evicted_stale"), 1);
    w.kill();
}

// ---------------------------------------------------------------------------------------
// 8. A woken `write_async` future left unpolled past the grace.
// ---------------------------------------------------------------------------------------

#[cfg(feature = "async")]
mod unpolled {
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use super::*;

    fn poll_once<F: Future + ?Sized>(fut: Pin<&mut F>) -> Poll<F::Output> {
        let mut cx = Context::from_waker(Waker::noop());
        fut.poll(&mut cx)
    }

    /// Role: holds a read lock until `release` exists.
    fn role_gate_reader() {
        let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
        let g = lock.try_read().expect("free");
        report("HELD");
        child_wait_for_path(&path_arg("release"), Duration::from_secs(30));
        drop(g);
        report("RELEASED");
    }

    /// Role: takes the write lock (blocking), marks `got`, writes 77, holds 300 ms
    /// (beating), unlocks; reports its token and when it unlocked.
    fn role_third_writer() {
        let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
        let g = lock
            .write_timeout(Duration::from_secs(10))
            .expect("the third writer never got in");
        std::fs::write(path_arg("got"), b"got").unwrap();
        let wrote = g.write(77).is_ok();
        let token = g.token();
        // Holds 300 ms, beating (a holder without progress for the grace is evicted).
        for _ in 0..15 {
            std::thread::sleep(Duration::from_millis(20));
            g.beat().unwrap();
        }
        let done = mono_ns();
        let unlocked = g.unlock().is_ok();
        report(format!(
            "DONE token={token} wrote={wrote} unlocked={unlocked} at={done}"
        ));
    }

    const UNPOLLED: &str =
        "unpolled::rwlock_woken_unpolled_write_future_that_lost_its_claim_claims_again";

    /// docs/shared-rwlock.md (Async): "A `write_async` future that is woken but not polled
    /// for longer than the grace may lose its claim to an eviction; it then claims again";
    /// "many readers or one writer"; fencing. This process's `write_async` future claims
    /// and drains behind a reader process (polled once); a writer process waits behind
    /// the claim; the reader leaves (the future is woken) and the future is not polled
    /// for 3 graces. If the other writer evicted the claim and got in, the future must
    /// stay pending while it holds, then complete with a current guard of a newer token
    /// that sees its write; if the claim was kept, the future's guard is that claim's.
    #[test]
    fn rwlock_woken_unpolled_write_future_that_lost_its_claim_claims_again() {
        play_role!(role_gate_reader, role_third_writer);
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("unpolled.rw");
        let grace = Duration::from_millis(300);
        let opts = RwLockOptions::default().grace(grace);
        let lock = SharedRwLock::<u64>::create_with(&path, 1, &opts).unwrap();
        let release = dir.path().join("release");
        let got = dir.path().join("got");
        let mut reader = RoleCommand::new(UNPOLLED, "gate_reader")
            .arg("path", &path)
            .arg("release", &release)
            .spawn();
        assert_eq!(reader.next_report(REPORT_WAIT), "HELD");
        let mut fut = Box::pin(lock.write_async());
        assert!(
            poll_once(fut.as_mut()).is_pending(),
            "drains behind the reader"
        );
        let claim = state_word(&path);
        assert_ne!(writer_of(claim), 0, "the future claimed");
        let claim_token = claim >> 24;
        let contended = counter(&lock, "write_contended");
        let mut third = RoleCommand::new(UNPOLLED, "third_writer")
            .arg("path", &path)
            .arg("got", &got)
            .spawn();
        assert!(
            wait_until(Duration::from_secs(10), || counter(
                &lock,
                "write_contended"
            ) > contended),
            "the third writer never waited"
        );
        std::fs::write(&release, b"go").unwrap();
        assert_eq!(reader.next_report(REPORT_WAIT), "RELEASED");
        // Woken (drained), not polled.
        let lost = cxc_testkit::wait_for_path(&got, grace * 3);
        let mut pending_polls = 0u32;
        if lost {
            // The other writer holds the lock now (300 ms): the future must not complete.
            let until = Instant::now() + Duration::from_millis(200);
            while Instant::now() < until {
                assert!(
                    poll_once(fut.as_mut()).is_pending(),
                    "the future completed while another process's writer held the lock \
                     (its claim was evicted)"
                );
                pending_polls += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let t = Instant::now();
        let g = loop {
            if let Poll::Ready(g) = poll_once(fut.as_mut()) {
                break g;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "never completed");
            std::thread::sleep(Duration::from_millis(1));
        };
        let ready_at = mono_ns();
        let current = g.is_current();
        let token = g.token();
        let seen = g.read();
        let wrote = g.write(5).is_ok();
        let unlocked = g.unlock().is_ok();
        let done = third.next_report(REPORT_WAIT);
        let stale = counter(&lock, "evicted_stale");
        println!(
            "lost={lost} (evicted_stale={stale}) pending_polls={pending_polls}; future: token \
             {token} (claim {claim_token}) current={current} seen={seen:?} wrote={wrote} \
             unlocked={unlocked}; third: {done}"
        );
        assert!(current && wrote && unlocked, "the future's guard was stale");
        assert!(flag(&done, "wrote") && flag(&done, "unlocked"), "{done}");
        if lost {
            assert!(stale >= 1, "the other writer got in without an eviction");
            assert!(
                token > num(&done, "token"),
                "the future's guard is not a new claim: {token} vs {done}"
            );
            assert_eq!(seen, Ok(77), "the future saw the other writer's write");
            assert!(
                ready_at >= num(&done, "at"),
                "completed before the other unlock"
            );
        } else {
            assert_eq!(token, claim_token, "kept its claim");
            assert_eq!(seen, Ok(1));
            assert!(num(&done, "token") > token);
        }
        let r = lock.read_timeout(Duration::from_secs(1)).expect("free");
        assert_eq!(r.get(), if lost { 5 } else { 77 });
    }
}

// ---------------------------------------------------------------------------------------
// 9. A forked child without a holder slot gets in once a holder dies.
// ---------------------------------------------------------------------------------------

/// Role: registers, forks a child that has no slot (full table); the child waits in
/// `read_timeout(5 s)` (or `read_async`), reports when it got in, holds until `release`.
fn role_slot_forker() {
    let lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
    drop(lock.try_read().expect("free"));
    let asynchronous = arg("mode") == "async";
    // SAFETY: the child only makes lock calls, reports, waits for a file and `_exit`s.
    let child = unsafe { libc::fork() };
    if child == 0 {
        let try_none = lock.try_read().is_none();
        report(format!("WAITING try_none={try_none}"));
        let got = if asynchronous {
            async_read_within(&lock, Duration::from_secs(5))
        } else {
            lock.read_timeout(Duration::from_secs(5))
        };
        let at = mono_ns();
        report(format!("CHILD got={} at={at}", got.is_some()));
        child_wait_for_path(&path_arg("release"), Duration::from_secs(30));
        drop(got);
        // SAFETY: ends the forked child without the parent's atexit handlers.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(child, &mut status, 0) };
    report(format!("PARENT status={status}"));
}

#[cfg(feature = "async")]
fn async_read_within(
    lock: &SharedRwLock<u64>,
    t: Duration,
) -> Option<cxc_sync::ReadGuard<'_, u64>> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { tokio::time::timeout(t, lock.read_async()).await.ok() })
}

#[cfg(not(feature = "async"))]
fn async_read_within(
    _lock: &SharedRwLock<u64>,
    _t: Duration,
) -> Option<cxc_sync::ReadGuard<'_, u64>> {
    unreachable!("async mode needs the async feature")
}

/// Role: takes a holder slot and lives until killed.
fn role_filler() {
    let _lock = SharedRwLock::<u64>::open(path_arg("path")).unwrap();
    report("FILLED");
    sleep_forever();
}

fn slotless_scenario(test: &str, mode: &str) {
    play_role!(role_slot_forker, role_filler);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("slotless.rw");
    let release = dir.path().join("release");
    let opts = RwLockOptions::default()
        .holders(3)
        .grace(Duration::from_secs(10));
    let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
    let mut filler = RoleCommand::new(test, "filler").arg("path", &path).spawn();
    assert_eq!(filler.next_report(REPORT_WAIT), "FILLED");
    let mut forker = RoleCommand::new(test, "slot_forker")
        .arg("path", &path)
        .arg("release", &release)
        .arg("mode", mode)
        .spawn();
    let waiting = forker.next_report(REPORT_WAIT);
    assert!(
        flag(&waiting, "try_none"),
        "the table was not full: {waiting}"
    );
    // Let the child settle into its wait (it may only get in after the kill anyway).
    std::thread::sleep(Duration::from_millis(150));
    let killed_at = mono_ns();
    filler.kill();
    let line = forker.next_report(REPORT_WAIT);
    let lat_ms = num(&line, "at").saturating_sub(killed_at) / 1_000_000;
    println!("mode={mode}: {line}; got in {lat_ms} ms after the filler's death");
    assert!(
        flag(&line, "got"),
        "mode={mode}: a slotless forked child never got in after a holder died: {line}"
    );
    assert!(
        lat_ms < 1000,
        "mode={mode}: the slotless child took {lat_ms} ms to take the dead holder's slot"
    );
    assert!(
        lock.write_timeout(Duration::from_millis(300)).is_none(),
        "mode={mode}: the child's read hold is not counted (a writer got in)"
    );
    std::fs::write(&release, b"go").unwrap();
    let tail = forker.finish(CHILD_DEADLINE);
    assert_eq!(tail.last().map(String::as_str), Some("PARENT status=0"));
    assert!(lock.write_timeout(Duration::from_secs(2)).is_some());
}

/// "a forked child that finds the table full gets `None` from `try_*` and waits in
/// `read`/`write` (asleep: it looks for a slot at each 20 ms check, which reclaims dead
/// holders first ...)"; "There are no untracked readers" — table of 3 (the parent, a
/// filler, the forker); the forker's child waits in `read_timeout`; the filler is killed:
/// the child must get in promptly, counted.
#[test]
fn rwlock_slotless_forked_child_blocked_in_read_gets_in_once_a_holder_dies() {
    slotless_scenario(
        "rwlock_slotless_forked_child_blocked_in_read_gets_in_once_a_holder_dies",
        "sync",
    );
}

/// As above with `read_async` ("an async waiter likewise").
#[cfg(feature = "async")]
#[test]
fn rwlock_slotless_forked_child_blocked_in_read_async_gets_in_once_a_holder_dies() {
    slotless_scenario(
        "rwlock_slotless_forked_child_blocked_in_read_async_gets_in_once_a_holder_dies",
        "async",
    );
}

// ---------------------------------------------------------------------------------------
// 10. A full table, an evicted writer's quarantine record, and its pid reused (root).
// ---------------------------------------------------------------------------------------

fn quarantine_reuse(test: &str, fallback: bool) {
    match procs::role().as_deref() {
        Some("nsroot") => procs::nsroot(test),
        Some("scenario") => quarantine_reuse_scenario(test, fallback),
        Some("qwriter") => {
            let lock = SharedRwLock::<u64>::open(procs::dir().join("rw")).unwrap();
            let w = lock.try_write().expect("free");
            w.write(11).unwrap();
            report("HELD");
            std::mem::forget(w);
            sleep_forever();
        }
        Some("qheir") => {
            let path = procs::dir().join("rw");
            let line = match SharedRwLock::<u64>::open(&path) {
                Ok(lock) => {
                    let q = quarantined(state_word(&path));
                    let wrote = lock
                        .write_timeout(Duration::from_secs(2))
                        .is_some_and(|w| w.write(13).is_ok() && w.unlock().is_ok());
                    // Leaked on purpose: this process keeps its slot while it lives.
                    std::mem::forget(lock);
                    format!("RESULT open=ok q_after_open={q} wrote={wrote}")
                }
                Err(e) => format!("RESULT open=err({e})"),
            };
            report(line);
            sleep_forever();
        }
        Some(other) => panic!("unknown role {other}"),
        None => procs::run_reuse_test(test, fallback),
    }
}

fn quarantine_reuse_scenario(test: &str, fallback: bool) {
    procs::mount_own_proc();
    assert_eq!(cxc_sync::liveness::fallback_active(), fallback);
    let path = procs::dir().join("rw");
    let opts = RwLockOptions::default()
        .holders(2)
        .grace(Duration::from_millis(200));
    let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
    let mut w = procs::spawn(test, "qwriter", &procs::dir(), &[]);
    procs::wait_line(&mut w, "HELD");
    let wpid = w.pid();
    w.stop();
    w.wait_state('T', Duration::from_secs(5));
    let g = lock
        .write_timeout(Duration::from_secs(3))
        .expect("the stopped writer is evicted after the grace");
    assert_eq!(g.read().unwrap(), 11);
    assert_ne!(
        quarantined(state_word(&path)),
        0,
        "its stage is quarantined"
    );
    g.write(12).unwrap();
    g.unlock().unwrap();
    w.kill();
    // Past the fallback path's same-tick window.
    std::thread::sleep(Duration::from_millis(30));
    let mut heir = procs::spawn_with_pid(wpid, test, "qheir", &[]);
    let line = procs::wait_line(&mut heir, "RESULT");
    let q_now = quarantined(state_word(&path));
    eprintln!("fallback={fallback}: heir (pid {wpid}): {line}; Q now {q_now:#x}");
    assert_eq!(
        line, "RESULT open=ok q_after_open=0 wrote=true",
        "a process given a dead evicted writer's pid (full table, quarantine record) was \
         refused, or the record's buffer stayed quarantined"
    );
    assert_eq!(q_now, 0, "a buffer stays quarantined while the heir lives");
    assert_eq!(lock.read_timeout(Duration::from_secs(1)).unwrap().get(), 13);
    assert!(heir.state().is_some(), "the heir lives");
}

/// "reap quarantine: `Q` −= b if `qtag[b]`'s writer slot belongs to a dead process";
/// "A full table of live processes is refused at `open` ... (dead holders are reclaimed
/// first)"; "pid reused" counts as dead — a 2-slot table: this process and a writer
/// stopped and evicted (quarantine record naming its slot), then killed; a new process
/// with its pid (fresh pid namespace) opens: admitted, no buffer left quarantined while
/// it lives (pidfs path).
#[test]
fn rwlock_heir_of_an_evicted_writers_pid_is_admitted_and_its_quarantine_reaped() {
    quarantine_reuse(
        "rwlock_heir_of_an_evicted_writers_pid_is_admitted_and_its_quarantine_reaped",
        false,
    );
}

/// As above, on the fallback identity path (pid + start time).
#[test]
fn rwlock_heir_of_an_evicted_writers_pid_is_admitted_and_its_quarantine_reaped_fallback() {
    quarantine_reuse(
        "rwlock_heir_of_an_evicted_writers_pid_is_admitted_and_its_quarantine_reaped_fallback",
        true,
    );
}

// ---------------------------------------------------------------------------------------
// 11. A reader killed while a `write_async` future drains behind it.
// ---------------------------------------------------------------------------------------

#[cfg(feature = "async")]
mod dead_reader_async {
    use super::*;

    /// Role: (main thread ended first if `late=1`) takes a read hold, lives until killed.
    fn role_holding_reader() {
        if arg("late") == "1" {
            assert!(exit_main_thread(), "the main thread did not exit");
        }
        let lock: &'static SharedRwLock<u64> =
            Box::leak(Box::new(SharedRwLock::open(path_arg("path")).unwrap()));
        std::mem::forget(lock.try_read().expect("free"));
        report("HELD");
        sleep_forever();
    }

    const KILLED_READER: &str = "dead_reader_async::rwlock_reader_killed_under_a_draining_write_async_is_reclaimed_by_the_reactor";

    /// docs/shared-rwlock.md (Async): "The reactor runs the parking protocol for each
    /// group and, in its checks, does what the blocking paths do every 20 ms: ...
    /// reclaim dead readers"; "a reader that dies does not [block writers]" — a reader
    /// process (plain; then one whose main thread exited first, on the fallback identity
    /// path) holds a read lock, this process's `write_async` future claims and drains
    /// behind it (grace 10 s, so only the dead-reader path can free it); the reader is
    /// SIGKILLed: the future must complete within 1 s, and not before the kill.
    #[test]
    fn rwlock_reader_killed_under_a_draining_write_async_is_reclaimed_by_the_reactor() {
        play_role!(role_holding_reader);
        let _s = serial();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for (late, fallback) in [(false, false), (true, true)] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("kr.rw");
            let opts = RwLockOptions::default().grace(Duration::from_secs(10));
            let lock = SharedRwLock::<u64>::create_with(&path, 4, &opts).unwrap();
            let mut cmd = RoleCommand::new(KILLED_READER, "holding_reader")
                .arg("path", &path)
                .arg("late", if late { "1" } else { "0" });
            if fallback {
                cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
            }
            let mut kid = cmd.spawn();
            assert_eq!(kid.next_report(REPORT_WAIT), "HELD");
            let (early, lat, token) = rt.block_on(async {
                let mut fut = Box::pin(lock.write_async());
                // Not before the kill: the reader lives for 300 ms.
                let early = tokio::time::timeout(Duration::from_millis(300), &mut fut)
                    .await
                    .is_ok();
                if early {
                    return (true, Duration::ZERO, 0);
                }
                let t = Instant::now();
                kid.kill();
                let g = tokio::time::timeout(Duration::from_secs(5), &mut fut)
                    .await
                    .expect("the dead reader was never reclaimed by the reactor");
                let lat = t.elapsed();
                assert!(g.is_current());
                assert_eq!(g.read().unwrap(), 4);
                (false, lat, g.token())
            });
            println!(
                "late={late} fallback={fallback}: got in {lat:?} after the kill (token {token})"
            );
            assert!(!early, "late={late}: got in beside a live reader");
            assert!(
                lat < Duration::from_secs(1),
                "late={late} fallback={fallback}: {lat:?} to reclaim a dead reader"
            );
            assert!(counter(&lock, "reclaimed") >= 1);
        }
    }
}
