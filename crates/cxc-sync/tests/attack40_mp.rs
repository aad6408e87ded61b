//! attack40: processes that change under the library's feet — `fork` inside an `update`
//! closure of a `SharedCell`, and `exec` by one thread while another holds a
//! `SharedRwLock` (docs/seqlock.md, docs/shared-cell.md, docs/shared-rwlock.md).
//!
//! 1. **Counter under forking closures and stops.** Three updater processes increment a
//!    sealed counter in a cell with `update` as fast as they can; about one closure in
//!    25 calls `fork`, and *both* processes return from the closure (the child finishes
//!    its copy of the parent's `update`: it reserves a slot of its own, may publish, and
//!    releases the claim word it copied). The parent SIGSTOPs/SIGCONTs the updaters at
//!    random (stall timeout 10 ms, so stopped holders are superseded). Every `Ok` is
//!    counted (parents and forked children); the final counter must equal the number of
//!    `Ok`s (S5: no increment lost, none doubled), and a reader checks every load is
//!    intact and never goes back (S1, S2).
//! 2. **A read hold cut by `exec`.** A thread holds a read lock while another thread
//!    `exec`s (the process lives on, same pid and identity). The docs say nothing of
//!    `exec` for the rwlock (the semaphore, the seqlock and the lease document it).
//!    Observed and asserted: the hold stays counted in the process's slot, the new image
//!    registers through that same slot, so its *own* `write` waits for a read hold no
//!    thread of it has, and every other writer waits as long as the process lives; the
//!    moment the process dies the next waiter reclaims it.
//! 3. **A write lock cut by `exec`, again and again.** A process takes the write lock,
//!    writes, and a sibling thread re-executes the process, whose new image takes the
//!    write lock again (evicting its old image after the grace) and so on. Each evicted
//!    claim's staging buffer stays quarantined while the process lives (its writer never
//!    "learns of the loss", its process is not dead), so after seven images every writer
//!    of every process gets `NoBuffer` until the process exits; then the first write
//!    reaps all of them.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).
#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]

mod procs;

use std::collections::HashMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{RwLockOptions, SharedCell, SharedRwLock, WriteError, WriteGuardError};
use cxc_testkit::{
    Proc, Rng, RoleCommand, arg, fields, intact, num, path_arg, play_role, read_word, report,
    sealed, serial, sleep_forever, wait_until,
};

type C = [u64; 6];

const REPORT_WAIT: Duration = Duration::from_secs(30);

fn me() -> u32 {
    std::process::id()
}

/// Re-executes this binary (the running image is replaced; pid and identity stay) in
/// `role` for `test`, with role argument `k` set to `k`; other role arguments are
/// inherited through the environment.
fn exec_self(test: &str, role: &str, k: u64) -> ! {
    let exe = std::env::current_exe().unwrap();
    let err = std::process::Command::new(exe)
        .args([
            "--exact",
            test,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(cxc_testkit::ROLE_VAR, role)
        .env(format!("{}K", cxc_testkit::ARG_VAR_PREFIX), k.to_string())
        .exec();
    panic!("exec failed: {err}");
}

// ---------------------------------------------------------------------------------------
// 1. A counter incremented by updaters whose closures fork, under SIGSTOP.
// ---------------------------------------------------------------------------------------

const COUNTER: &str =
    "cell_counter_with_forking_update_closures_and_stops_loses_and_doubles_nothing";

fn code(r: &Result<cxc_sync::Written, WriteError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(WriteError::Superseded) => "superseded",
        Err(WriteError::NoWriterSlot) => "noslot",
        Err(_) => "other",
    }
}

/// Role: updates the counter until the marker `stop` (or 40 s). About one closure in 25
/// forks; the forked child returns from the closure too, records what its copy of the
/// `update` returned in `dir/child-<pid>` and leaves with `_exit`.
fn role_counter() {
    let path = path_arg("path");
    let dir = path_arg("dir");
    let w: u64 = arg("w").parse().unwrap();
    let cell = SharedCell::<C>::open(&path).unwrap();
    let stop = dir.join("stop");
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut rng = Rng::new(cxc_testkit::mix(u64::from(me()) << 4 | w));
    let (mut ok, mut sup, mut noslot, mut forks, mut died, mut stalled) = (0u64, 0, 0, 0, 0, 0);
    let mut kids: Vec<libc::pid_t> = Vec::new();
    let mut n = 0u64;
    while !stop.exists() && Instant::now() < deadline {
        n += 1;
        let fork_now = rng.below(25) == 0;
        let parent_nap = rng.below(4);
        let child_nap = rng.below(4);
        let mypid = me();
        let mut torn = None;
        let r = cell.update(|v| {
            if !intact(v) {
                torn = Some(*v);
            }
            *v = sealed(v[0] + 1);
            if fork_now {
                // SAFETY: fork in a role process; the child goes on in the library's own
                // code (atomics on the shared mapping, a slot reservation), writes one
                // file and `_exit`s.
                let pid = unsafe { libc::fork() };
                assert!(pid >= 0, "fork failed");
                if pid == 0 {
                    std::thread::sleep(Duration::from_micros(300 * child_nap));
                } else {
                    kids.push(pid);
                    std::thread::sleep(Duration::from_micros(300 * parent_nap));
                }
            }
        });
        if me() != mypid {
            // The forked child, after its copy of the parent's update.
            let line = format!("r={} torn={}", code(&r), torn.is_some());
            let f = dir.join(format!("child-{}", me()));
            let tmp = dir.join(format!("tmp-{}", me()));
            let _ = std::fs::write(&tmp, line);
            let _ = std::fs::rename(&tmp, &f);
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        if let Some(v) = torn {
            report(format!("TORN {v:x?}"));
        }
        if fork_now {
            forks += 1;
        }
        match r {
            Ok(wr) => {
                ok += 1;
                match wr.abandoned {
                    Some(cxc_sync::Abandoned::Died) => died += 1,
                    Some(cxc_sync::Abandoned::Stalled) => stalled += 1,
                    _ => {}
                }
            }
            Err(WriteError::Superseded) => sup += 1,
            Err(WriteError::NoWriterSlot) => noslot += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
        // Reap finished children now and then.
        if n.is_multiple_of(16) {
            kids.retain(|&k| {
                // SAFETY: waitpid on our own child, without blocking.
                unsafe { libc::waitpid(k, std::ptr::null_mut(), libc::WNOHANG) == 0 }
            });
        }
    }
    for k in kids {
        // SAFETY: waitpid on our own child (they only sleep briefly and `_exit`).
        unsafe { libc::waitpid(k, std::ptr::null_mut(), 0) };
    }
    report(format!(
        "ok={ok} sup={sup} noslot={noslot} forks={forks} died={died} stalled={stalled} n={n}"
    ));
}

/// docs/seqlock.md, Update: "it publishes only if nothing was published since its input
/// was read, else it returns `Err(Superseded)`"; invariant S5 "an update is atomic"; S1
/// "no torn read"; S2 "a read never goes back"; Writer slots: "A forked child's copy of a
/// handle sees its parent's pid in the lanes and reserves slots of its own"; Protocol: a
/// writer "SIGSTOPped anywhere ... blocks nobody". With closures that fork (both
/// processes finish the update) and updaters stopped at random, the counter must equal
/// the number of `Ok`s returned to anyone.
#[test]
fn cell_counter_with_forking_update_closures_and_stops_loses_and_doubles_nothing() {
    play_role!(role_counter);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("counter.cell");
    let cell = SharedCell::<C>::create(&path, sealed(0)).unwrap();
    let mut rng = Rng::for_test();
    let mut ups: Vec<Proc> = (0..3u64)
        .map(|w| {
            RoleCommand::new(COUNTER, "counter")
                .arg("path", &path)
                .arg("dir", d.path())
                .arg("w", w.to_string())
                .spawn()
        })
        .collect();
    let done = AtomicBool::new(false);
    let loads = AtomicU64::new(0);
    let (bad, last) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let (mut prev, mut bad) = (0u64, Vec::new());
            while !done.load(Ordering::Relaxed) {
                let v = cell.load();
                loads.fetch_add(1, Ordering::Relaxed);
                if !intact(&v) {
                    bad.push(format!("torn {v:x?}"));
                } else if v[0] < prev {
                    bad.push(format!("went back {prev} -> {}", v[0]));
                } else {
                    prev = v[0];
                }
                if bad.len() > 10 {
                    break;
                }
            }
            (bad, prev)
        });
        // 4 s of random stops.
        let t = Instant::now();
        let mut stops = 0;
        while t.elapsed() < Duration::from_secs(4) {
            std::thread::sleep(Duration::from_millis(rng.below(20) + 5));
            let i = rng.below(3) as usize;
            ups[i].stop();
            stops += 1;
            std::thread::sleep(Duration::from_millis(rng.below(30) + 1));
            ups[i].cont();
        }
        for p in &ups {
            p.cont();
        }
        eprintln!("{stops} stops");
        std::fs::write(d.path().join("stop"), b"").unwrap();
        let mut reps = Vec::new();
        for p in &mut ups {
            let lines = p.finish(Duration::from_secs(60));
            reps.extend(lines);
        }
        done.store(true, Ordering::Relaxed);
        let r = reader.join().unwrap();
        eprintln!("updater reports: {reps:?}");
        for l in &reps {
            assert!(
                !l.starts_with("TORN"),
                "an update closure got a torn input: {l}"
            );
        }
        let mut totals: HashMap<&str, u64> = HashMap::new();
        for l in reps.iter().filter(|l| l.starts_with("ok=")) {
            for k in ["ok", "sup", "noslot", "forks", "died", "stalled", "n"] {
                *totals.entry(k).or_default() += num(l, k);
            }
        }
        assert_eq!(
            reps.iter().filter(|l| l.starts_with("ok=")).count(),
            3,
            "every updater reports: {reps:?}"
        );
        // The forked children's results.
        let forks = totals["forks"];
        let ok_children = {
            let got = wait_until(Duration::from_secs(30), || {
                std::fs::read_dir(d.path())
                    .unwrap()
                    .filter(|e| {
                        e.as_ref()
                            .unwrap()
                            .file_name()
                            .to_string_lossy()
                            .starts_with("child-")
                    })
                    .count() as u64
                    >= forks
            });
            assert!(got, "not every forked child wrote its result");
            let mut by: HashMap<String, u64> = HashMap::new();
            for e in std::fs::read_dir(d.path()).unwrap() {
                let e = e.unwrap();
                if e.file_name().to_string_lossy().starts_with("child-") {
                    let l = std::fs::read_to_string(e.path()).unwrap();
                    assert!(
                        !cxc_testkit::flag(&l, "torn"),
                        "a forked child's closure input was torn: {l}"
                    );
                    *by.entry(fields(&l)["r"].to_owned()).or_default() += 1;
                }
            }
            eprintln!("forked children: {by:?} (of {forks} forks)");
            by.get("ok").copied().unwrap_or(0)
        };
        let final_v = cell.load();
        let ok = totals["ok"] + ok_children;
        eprintln!(
            "totals {totals:?}, children ok {ok_children}, final {} , loads {}, counters {:?}",
            final_v[0],
            loads.load(Ordering::Relaxed),
            cell.counters()
        );
        assert!(intact(&final_v), "final value torn: {final_v:x?}");
        assert!(forks > 5, "too few forks to mean anything: {forks}");
        assert!(totals["ok"] > 1000, "the updaters hardly ran: {totals:?}");
        assert_eq!(
            final_v[0],
            ok,
            "S5: the counter ({}) is not the number of successful updates ({} by updaters \
             + {ok_children} by forked children): an increment was {}",
            final_v[0],
            totals["ok"],
            if final_v[0] < ok { "lost" } else { "doubled" }
        );
        r
    });
    assert!(bad.is_empty(), "reader: {bad:?}");
    assert!(last <= cell.load()[0]);
}

// ---------------------------------------------------------------------------------------
// 2. A read hold cut by another thread's exec.
// ---------------------------------------------------------------------------------------

const EXEC_READ: &str =
    "rwlock_read_hold_cut_by_exec_is_kept_while_the_process_lives_then_reclaimed";

/// Role (image 1): a thread takes a read lock and keeps it; the main thread then `exec`s
/// this binary as `reader_image2`.
fn role_exec_reader() {
    let path = path_arg("path");
    let lock: &'static SharedRwLock<u64> =
        Box::leak(Box::new(SharedRwLock::<u64>::open(&path).unwrap()));
    let held = std::sync::Arc::new(AtomicBool::new(false));
    let h = held.clone();
    std::thread::spawn(move || {
        let g = lock.read();
        assert_eq!(g.get(), 7);
        h.store(true, Ordering::SeqCst);
        sleep_forever();
    });
    assert!(wait_until(Duration::from_secs(20), || held.load(Ordering::SeqCst)));
    report(format!("image1 pid={} holding", me()));
    exec_self(EXEC_READ, "reader_image2", 2);
}

/// Role (image 2, same process): what the new image finds and can do.
fn role_reader_image2() {
    let path = path_arg("path");
    let before = SharedRwLock::<()>::inspect(&path).unwrap();
    let mine_before = before
        .holders
        .iter()
        .filter(|h| h.pid == me())
        .map(|h| h.readers)
        .sum::<u64>();
    let lock = SharedRwLock::<u64>::open(&path).unwrap();
    let read_ok = lock.read_timeout(Duration::from_secs(5)).map(|g| g.get());
    let slots_mine = SharedRwLock::<()>::inspect(&path)
        .unwrap()
        .holders
        .iter()
        .filter(|h| h.pid == me())
        .count();
    let t = Instant::now();
    let own_write = lock.write_timeout(Duration::from_millis(1500)).is_some();
    report(format!(
        "image2 pid={} readers_before={mine_before} slots_mine={slots_mine} read={} \
         own_write={own_write} waited_ms={}",
        me(),
        read_ok.unwrap_or(u64::MAX),
        t.elapsed().as_millis()
    ));
    sleep_forever();
}

/// docs/shared-rwlock.md: "There are no untracked readers: a read hold is always counted
/// in the holder's slot"; "a process that dies holding the lock (read or write) is
/// reclaimed by the next waiter and never blocks the lock forever"; Pitfalls: "A read
/// hold in *another* thread of the same process also delays the writer until it is
/// dropped". The docs say nothing of `exec` (docs/shared-semaphore.md does: "the new
/// image reuses the old image's slot; permits the old image held stay held until the
/// process dies"). Asserted: the hold stays counted after the exec; the new image is
/// registered through the same slot, so its own write lock waits for a hold that no
/// thread of it has, and so does every other process's; once the process dies the next
/// writer gets in at once.
#[test]
fn rwlock_read_hold_cut_by_exec_is_kept_while_the_process_lives_then_reclaimed() {
    play_role!(role_exec_reader, role_reader_image2);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("exec_read.rw");
    let opts = RwLockOptions::default().grace(Duration::from_millis(200));
    let lock = SharedRwLock::<u64>::create_with(&path, 7, &opts).unwrap();
    let mut p = RoleCommand::new(EXEC_READ, "exec_reader")
        .arg("path", &path)
        .spawn();
    let l1 = p.next_report(REPORT_WAIT);
    let l2 = p.next_report(REPORT_WAIT);
    eprintln!("{l1}\n{l2}");
    assert_eq!(
        num(&l2, "pid"),
        u64::from(p.pid()),
        "the new image is the same process"
    );
    assert_eq!(
        num(&l2, "readers_before"),
        1,
        "the old image's read hold is still counted after the exec: {l2}"
    );
    assert_eq!(
        num(&l2, "slots_mine"),
        1,
        "the new image took the same slot: {l2}"
    );
    assert_eq!(num(&l2, "read"), 7, "{l2}");
    // Undocumented: the new image's own write lock waits for the old image's hold.
    assert!(
        !cxc_testkit::flag(&l2, "own_write"),
        "the new image got the write lock past its old image's read hold: {l2}"
    );
    // Another process's writer waits too, as long as the process lives.
    let t = Instant::now();
    let other = lock.write_timeout(Duration::from_millis(1500)).is_some();
    eprintln!(
        "other process's write while the exec'd process lives: {other} after {:?}",
        t.elapsed()
    );
    assert!(
        !other,
        "the old image's read hold was dropped while the process lives"
    );
    // Its readers are not blocked once no writer waits.
    assert_eq!(
        lock.read_timeout(Duration::from_secs(5)).map(|g| g.get()),
        Some(7)
    );
    // The process dies: the next waiter reclaims its slot at once.
    p.kill();
    let t = Instant::now();
    let g = lock.write_timeout(Duration::from_secs(20));
    let took = t.elapsed();
    eprintln!(
        "after the kill: write in {took:?}; stats {:?}",
        lock.stats()
    );
    let g = g.expect("the dead process's read hold was never reclaimed");
    g.write(8).unwrap();
    drop(g);
    assert!(took < Duration::from_secs(5), "reclaim took {took:?}");
    let snap = SharedRwLock::<()>::inspect(&path).unwrap();
    assert!(
        snap.holders.iter().all(|h| h.readers == 0),
        "{:?}",
        snap.holders
    );
}

// ---------------------------------------------------------------------------------------
// 3. A write lock cut by exec, image after image.
// ---------------------------------------------------------------------------------------

const EXEC_WRITE: &str =
    "rwlock_writer_reexecuting_while_holding_leaks_a_buffer_per_image_until_it_exits";
/// Images at most (the leak stops the chain with `NoBuffer` before that).
const MAX_IMAGES: u64 = 12;
/// The state word: file offset 128 (after the 128-byte header); quarantine bits 16..24.
const STATE_AT: u64 = 128;

fn quarantined(path: &Path) -> u32 {
    ((read_word(path, STATE_AT) >> 16) & 0xFF).count_ones()
}

/// Role: image `k` of one process. Takes the write lock (from image 2 on this waits for
/// its previous image's claim and evicts it after the grace), writes `k`; if that worked
/// and `k < MAX_IMAGES`, a sibling thread re-executes the process while this thread keeps
/// the guard. Otherwise it gives the lock up and sleeps.
fn role_exec_writer() {
    let path = path_arg("path");
    let k: u64 = arg("k").parse().unwrap();
    let lock: &'static SharedRwLock<u64> =
        Box::leak(Box::new(SharedRwLock::<u64>::open(&path).unwrap()));
    let t = Instant::now();
    let g = lock
        .write_timeout(Duration::from_secs(20))
        .expect("image: no write lock within 20 s");
    let waited = t.elapsed().as_millis();
    let r = g.write(k);
    let q = quarantined(&path);
    let what = match r {
        Ok(()) => "ok",
        Err(WriteGuardError::NoBuffer) => "nobuffer",
        Err(WriteGuardError::Lost { .. }) => "lost",
        Err(_) => "other",
    };
    report(format!(
        "image={k} pid={} write={what} q={q} waited_ms={waited}",
        me()
    ));
    if r.is_ok() && k < MAX_IMAGES {
        std::thread::spawn(move || exec_self(EXEC_WRITE, "exec_writer", k + 1));
        // Keeps `g` (the write lock) until the exec ends this thread.
        let _g = g;
        sleep_forever();
    }
    drop(g);
    sleep_forever();
}

/// docs/shared-rwlock.md, Fencing: the evicted writer's "staging buffer was quarantined at
/// eviction ...; it frees the buffer itself when it learns of the loss, or
/// `reap_quarantine` frees it once its process is dead"; `WriteGuardError::NoBuffer`
/// ("all are published or quarantined for evicted, live writers"); "a process that dies
/// holding the lock ... never blocks the lock forever". A writer cut by `exec` never
/// learns, and its process lives on: asserted that each image leaks one buffer, that
/// after seven every writer (the process's and another's) is refused with `NoBuffer`
/// while the process lives, and that the first write after its death reaps them all.
/// The docs do not warn of it (the seqlock's Pitfalls do warn of `exec` keeping slots).
#[test]
fn rwlock_writer_reexecuting_while_holding_leaks_a_buffer_per_image_until_it_exits() {
    play_role!(role_exec_writer);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("exec_write.rw");
    let opts = RwLockOptions::default().grace(Duration::from_millis(100));
    let lock = SharedRwLock::<u64>::create_with(&path, 0, &opts).unwrap();
    let mut p = RoleCommand::new(EXEC_WRITE, "exec_writer")
        .arg("path", &path)
        .arg("k", "1")
        .spawn();
    let mut lines = Vec::new();
    loop {
        let l = p.next_report(REPORT_WAIT);
        eprintln!("{l}");
        assert_eq!(
            num(&l, "pid"),
            u64::from(p.pid()),
            "one process throughout: {l}"
        );
        let done = fields(&l)["write"] != "ok" || num(&l, "image") >= MAX_IMAGES;
        lines.push(l);
        if done {
            break;
        }
    }
    // Image k evicted image k-1: k-1 buffers quarantined when it wrote (one per image).
    for (i, l) in lines.iter().enumerate() {
        let k = i as u64 + 1;
        assert_eq!(num(l, "q"), (k - 1).min(7), "image {k}: {l}");
    }
    let last = lines.last().unwrap();
    assert_eq!(
        fields(last)["write"],
        "nobuffer",
        "expected the 8th image to be refused a buffer: {lines:?}"
    );
    assert_eq!(num(last, "image"), 8, "{lines:?}");
    // While the process lives, another process's writer is refused too.
    let g = lock
        .write_timeout(Duration::from_secs(10))
        .expect("the lock is free (the last image gave it up)");
    let r = g.write(100);
    eprintln!("another process's write while the re-executed process lives: {r:?}");
    assert_eq!(r, Err(WriteGuardError::NoBuffer));
    drop(g);
    assert_eq!(quarantined(&path), 7);
    // The process dies: the next write reaps every quarantine of its slot.
    p.kill();
    let g = lock
        .write_timeout(Duration::from_secs(10))
        .expect("write lock after the death");
    assert_eq!(g.write(101), Ok(()));
    drop(g);
    assert_eq!(lock.read().get(), 101);
    assert_eq!(quarantined(&path), 0, "stats {:?}", lock.stats());
}
