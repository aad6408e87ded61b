//! SharedRwLock across real processes: dead readers and writers reclaimed, a stopped
//! writer evicted and fenced, the holder table full, writers not starved by a stream of
//! readers, and a chaos run (readers and writers SIGKILLed and SIGSTOPped at random)
//! checked against an independent log of critical sections.
//!
//! Each test re-executes this binary in a role (`cxc_testkit`).
#![cfg(not(cxc_loom))]

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use cxc_sync::{RwLockError, RwLockOptions, SharedRwLock, WriteGuardError};
use cxc_testkit::{Proc, Rng, RoleCommand, arg, fields, path_arg, report, role, wait_for_path};

type P = [u64; 4];

fn opts(grace_ms: u64) -> RwLockOptions {
    RwLockOptions::default()
        .grace(Duration::from_millis(grace_ms))
        .holders(32)
}

/// CLOCK_MONOTONIC in ns: one clock for every process on the machine.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Appends one line to the independent log with a single `write` (O_APPEND: lines of
/// different processes never interleave).
fn log_line(log: &Path, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .unwrap();
    f.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// Takes the lock with `lock_within` (given a 5 s timeout): it must get in, within 2 s.
fn in_soon<G>(what: &str, lock_within: impl FnOnce(Duration) -> Option<G>) -> G {
    let t = Instant::now();
    let g = lock_within(Duration::from_secs(5)).expect(what);
    let took = t.elapsed();
    assert!(took < Duration::from_secs(2), "{what}: {took:?}");
    g
}

#[test]
fn dead_reader_and_dead_writer_are_reclaimed() {
    match role().as_deref() {
        Some("reader") => {
            let lock = SharedRwLock::<P>::open(path_arg("path")).unwrap();
            let _g = lock.read();
            report("held=read");
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        Some("writer") => {
            let lock = SharedRwLock::<P>::open(path_arg("path")).unwrap();
            let g = lock.write();
            g.write([5; 4]).unwrap();
            report(format!("held=write token={}", g.token()));
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        _ => {}
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.rw");
    let lock = SharedRwLock::<P>::create_with(&path, [0; 4], &opts(10_000)).unwrap();
    let mut r = RoleCommand::new("dead_reader_and_dead_writer_are_reclaimed", "reader")
        .arg("path", &path)
        .spawn();
    r.next_report(Duration::from_secs(20));
    assert!(lock.try_write().is_none());
    r.kill();
    // The grace is 10 s: only the proof of death lets the writer in this soon.
    drop(in_soon("wedged by a dead reader", |t| {
        lock.write_timeout(t)
    }));
    let mut wr = RoleCommand::new("dead_reader_and_dead_writer_are_reclaimed", "writer")
        .arg("path", &path)
        .spawn();
    let rep = wr.next_report(Duration::from_secs(20));
    let token: u64 = fields(&rep)["token"].parse().unwrap();
    assert!(lock.try_read().is_none());
    wr.kill();
    let g = in_soon("wedged by a dead writer", |t| lock.read_timeout(t));
    assert_eq!(g.get(), [5; 4], "the dead writer's published write is kept");
    drop(g);
    assert!(lock.write().token() > token);
}

#[test]
fn stopped_writer_is_evicted_and_its_writes_never_visible() {
    if role().as_deref() == Some("writer") {
        let lock = SharedRwLock::<P>::open(path_arg("path")).unwrap();
        let g = lock.write();
        report(format!("held=write token={}", g.token()));
        // The parent stops this process here, then lets it go on.
        let go = path_arg("go");
        assert!(wait_for_path(&go, Duration::from_secs(60)));
        let res = g.write([666; 4]);
        let unlocked = g.unlock();
        report(format!(
            "write_lost={} unlock_lost={}",
            matches!(res, Err(WriteGuardError::Lost { .. })),
            matches!(unlocked, Err(WriteGuardError::Lost { .. }))
        ));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.rw");
    let go = dir.path().join("go");
    let lock = SharedRwLock::<P>::create_with(&path, [1; 4], &opts(200)).unwrap();
    let mut w = RoleCommand::new(
        "stopped_writer_is_evicted_and_its_writes_never_visible",
        "writer",
    )
    .arg("path", &path)
    .arg("go", &go)
    .spawn();
    let rep = w.next_report(Duration::from_secs(20));
    let old: u64 = fields(&rep)["token"].parse().unwrap();
    w.stop();
    let t = Instant::now();
    let g = lock
        .write_timeout(Duration::from_secs(10))
        .expect("stopped writer wedged the lock");
    assert!(t.elapsed() >= Duration::from_millis(200));
    assert!(g.token() > old);
    g.write([2; 4]).unwrap();
    drop(g);
    std::fs::write(&go, b"go").unwrap();
    w.cont();
    let rep = w.next_report(Duration::from_secs(20));
    assert_eq!(fields(&rep)["write_lost"], "true");
    assert_eq!(fields(&rep)["unlock_lost"], "true");
    assert_eq!(lock.read().get(), [2; 4]);
    // Its buffer left quarantine: further writes still find buffers.
    for i in 0..20 {
        lock.write().write([i; 4]).unwrap();
    }
}

#[test]
fn full_holder_table_is_refused_until_a_holder_dies() {
    if role().as_deref() == Some("opener") {
        match SharedRwLock::<P>::open(path_arg("path")) {
            Ok(_) => {
                report("open=ok");
                std::thread::sleep(Duration::from_secs(60));
            }
            Err(RwLockError::TableFull { capacity }) => report(format!("open=full cap={capacity}")),
            Err(e) => report(format!("open=error {e}")),
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.rw");
    let _lock = SharedRwLock::<P>::create_with(&path, [0; 4], &opts(1000).holders(2)).unwrap();
    let test = "full_holder_table_is_refused_until_a_holder_dies";
    let mut a = RoleCommand::new(test, "opener").arg("path", &path).spawn();
    assert_eq!(a.next_report(Duration::from_secs(20)), "open=ok");
    let mut b = RoleCommand::new(test, "opener").arg("path", &path).spawn();
    assert_eq!(b.next_report(Duration::from_secs(20)), "open=full cap=2");
    a.kill();
    let mut c = RoleCommand::new(test, "opener").arg("path", &path).spawn();
    assert_eq!(c.next_report(Duration::from_secs(20)), "open=ok");
}

#[test]
fn writers_are_not_starved_by_a_stream_of_readers() {
    match role().as_deref() {
        Some("reader") => {
            let lock = SharedRwLock::<P>::open(path_arg("path")).unwrap();
            let until: u64 = arg("until").parse().unwrap();
            let mut n = 0u64;
            while now_ns() < until {
                let g = lock.read();
                spin_for(Duration::from_micros(500));
                drop(g);
                n += 1;
            }
            report(format!("reads={n}"));
            return;
        }
        Some("writer") => {
            let lock = SharedRwLock::<P>::open(path_arg("path")).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            let mut worst = Duration::ZERO;
            for i in 0..50 {
                let t = Instant::now();
                let g = lock.write();
                worst = worst.max(t.elapsed());
                g.write([i; 4]).unwrap();
                drop(g);
                std::thread::sleep(Duration::from_millis(5));
            }
            report(format!("writes=50 worst_us={}", worst.as_micros()));
            return;
        }
        _ => {}
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.rw");
    let _lock = SharedRwLock::<P>::create_with(&path, [0; 4], &opts(5000)).unwrap();
    let test = "writers_are_not_starved_by_a_stream_of_readers";
    let until = now_ns() + 8_000_000_000;
    // Four readers whose holds overlap all the time: without writer preference the
    // read count would never reach 0.
    let readers: Vec<Proc> = (0..4)
        .map(|_| {
            RoleCommand::new(test, "reader")
                .arg("path", &path)
                .arg("until", until.to_string())
                .spawn()
        })
        .collect();
    let mut w = RoleCommand::new(test, "writer").arg("path", &path).spawn();
    let rep = w.next_report(Duration::from_secs(30));
    let worst: u64 = fields(&rep)["worst_us"].parse().unwrap();
    eprintln!("writer under a reader stream: {rep}");
    assert!(worst < 500_000, "writer waited {worst} µs");
    for mut r in readers {
        let rep = r.next_report(Duration::from_secs(30));
        assert!(fields(&rep)["reads"].parse::<u64>().unwrap() > 0);
    }
}

/// One critical section from the log: kind, start, end (CLOCK_MONOTONIC ns).
struct Section {
    write: bool,
    pid: u32,
    start: u64,
    end: u64,
}

#[test]
fn chaos_kill_and_stop_never_breaks_exclusion() {
    if let Some(r @ ("reader" | "writer")) = role().as_deref() {
        {
            let lock = SharedRwLock::<P>::open(path_arg("path")).unwrap();
            let log = path_arg("log");
            let until: u64 = arg("until").parse().unwrap();
            let mut rng = Rng::new(u64::from(std::process::id()));
            let pid = std::process::id();
            while now_ns() < until {
                if r == "reader" {
                    let g = lock.read();
                    let start = now_ns();
                    let v = g.get();
                    assert!(v.iter().all(|x| *x == v[0]), "torn read {v:?}");
                    spin_for(Duration::from_micros(rng.range(0, 400)));
                    let end = now_ns();
                    drop(g);
                    log_line(&log, &format!("R {pid} {start} {end} 1"));
                } else {
                    let g = lock.write();
                    let start = now_ns();
                    let ok = match g.read() {
                        Ok(v) => {
                            assert!(v.iter().all(|x| *x == v[0]), "torn payload {v:?}");
                            g.write([g.token(); 4]).is_ok()
                        }
                        Err(_) => false,
                    };
                    spin_for(Duration::from_micros(rng.range(0, 400)));
                    let end = now_ns();
                    let ok = g.unlock().is_ok() && ok;
                    log_line(&log, &format!("W {pid} {start} {end} {}", u8::from(ok)));
                }
                std::thread::sleep(Duration::from_micros(rng.range(0, 300)));
            }
        }
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.rw");
    let log = dir.path().join("log");
    let lock = SharedRwLock::<P>::create_with(&path, [0; 4], &opts(150)).unwrap();
    let test = "chaos_kill_and_stop_never_breaks_exclusion";
    let mut rng = Rng::for_test();
    let run = Duration::from_secs(6);
    let until = now_ns() + run.as_nanos() as u64;
    let spawn = |i: usize| {
        RoleCommand::new(
            test,
            if i.is_multiple_of(2) {
                "reader"
            } else {
                "writer"
            },
        )
        .arg("path", &path)
        .arg("log", &log)
        .arg("until", until.to_string())
        .spawn()
    };
    let mut kids: Vec<Proc> = (0..6).map(spawn).collect();
    let (mut kills, mut stops) = (0, 0);
    let t0 = Instant::now();
    while t0.elapsed() < run - Duration::from_millis(500) {
        std::thread::sleep(Duration::from_millis(rng.range(50, 250)));
        let i = rng.below(kids.len() as u64) as usize;
        if rng.percent(50) {
            kids[i].kill();
            kids[i] = spawn(i);
            kills += 1;
        } else {
            kids[i].stop();
            std::thread::sleep(Duration::from_millis(rng.range(100, 600)));
            kids[i].cont();
            stops += 1;
        }
    }
    for k in &mut kids {
        k.wait_timeout(Duration::from_secs(30))
            .expect("a child hung");
    }
    // Every process is gone: the lock must be free at once (no wedge).
    let g = lock
        .write_timeout(Duration::from_secs(3))
        .expect("lock wedged after the chaos");
    drop(g);
    let text = std::fs::read_to_string(&log).unwrap();
    let sections: Vec<Section> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() == 5 && f[4] == "1").then(|| Section {
                write: f[0] == "W",
                pid: f[1].parse().unwrap(),
                start: f[2].parse().unwrap(),
                end: f[3].parse().unwrap(),
            })
        })
        .collect();
    let writes = sections.iter().filter(|s| s.write).count();
    let reads = sections.len() - writes;
    let refused = text.lines().filter(|l| l.ends_with(" 0")).count();
    let counters = lock.counters();
    eprintln!(
        "chaos: {kills} kills, {stops} stops, {reads} reads, {writes} writes, {refused} fenced \
         writer sections; counters {counters:?}"
    );
    assert!(writes > 20 && reads > 20, "too little progress");
    // Independent check: no completed write section overlaps any other section.
    let mut ws: Vec<&Section> = sections.iter().filter(|s| s.write).collect();
    ws.sort_by_key(|s| s.start);
    for s in &sections {
        for w in &ws {
            if std::ptr::eq(*w, s) || w.start > s.end {
                continue;
            }
            assert!(
                w.end < s.start || s.end < w.start,
                "writer {} [{}, {}] overlaps {} {} [{}, {}]",
                w.pid,
                w.start,
                w.end,
                if s.write { "writer" } else { "reader" },
                s.pid,
                s.start,
                s.end
            );
        }
    }
}
