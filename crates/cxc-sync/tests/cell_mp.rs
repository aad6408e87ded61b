//! `SharedCell` across processes (issue #20): writers in several processes are SIGKILLed
//! and SIGSTOPped at random while storing and updating; readers in other processes never
//! see a torn value (checksummed payload) and never wait for a writer; once every writer is
//! dead a store completes at once, and so does an update (a holder of the update claim
//! that was killed is judged dead by the OS, not waited out: the parent's stall timeout
//! is 10 s).

use std::time::{Duration, Instant};

use cxc_sync::{SharedCell, WriteError};
use cxc_testkit::{Proc, Rng, RoleCommand, arg, fields, intact, path_arg, report, role, sealed};

const TEST: &str = "writers_killed_and_stopped_never_tear_nor_wedge";

fn writer_role() {
    let cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
    let id: u64 = arg("id").parse().unwrap();
    report("ready=1");
    let mut i = 0u64;
    loop {
        i += 1;
        if i.is_multiple_of(8) {
            // An update may be superseded (stopped past the others' stall timeout) or
            // conflict with a store: its result is then not published.
            match cell.update(|v| *v = sealed(id << 40 | i)) {
                Ok(_) | Err(WriteError::Superseded) => {}
                Err(e) => panic!("update: {e}"),
            }
        } else {
            cell.store(sealed(id << 40 | i)).unwrap();
        }
    }
}

fn reader_role() {
    let cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
    let until = Instant::now() + Duration::from_millis(arg("ms").parse().unwrap());
    let (mut reads, mut torn, mut slowest) = (0u64, 0u64, Duration::ZERO);
    report("ready=1");
    while Instant::now() < until {
        let t = Instant::now();
        let v = cell.load();
        slowest = slowest.max(t.elapsed());
        if !intact(&v) {
            torn += 1;
        }
        reads += 1;
    }
    report(format!(
        "reads={reads} torn={torn} slowest_us={}",
        slowest.as_micros()
    ));
}

fn spawn_writer(path: &std::path::Path, id: u64) -> Proc {
    let mut p = RoleCommand::new(TEST, "writer")
        .arg("path", path)
        .arg("id", id.to_string())
        .spawn();
    assert_eq!(
        fields(&p.next_report(Duration::from_secs(30)))["ready"],
        "1"
    );
    p
}

#[test]
fn writers_killed_and_stopped_never_tear_nor_wedge() {
    match role().as_deref() {
        Some("writer") => return writer_role(),
        Some("reader") => return reader_role(),
        _ => {}
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("torture.cell");
    let mut cell = SharedCell::create(&path, sealed(0)).unwrap();
    cell.set_stall_timeout(Duration::from_secs(10));
    let mut rng = Rng::for_test();
    let run_ms = 2500u64;
    let mut readers: Vec<Proc> = (0..2)
        .map(|_| {
            let mut p = RoleCommand::new(TEST, "reader")
                .arg("path", &path)
                .arg("ms", run_ms.to_string())
                .spawn();
            assert_eq!(
                fields(&p.next_report(Duration::from_secs(30)))["ready"],
                "1"
            );
            p
        })
        .collect();
    let mut next_id = 1u64;
    let mut writers: Vec<(Proc, bool)> = (0..3)
        .map(|_| {
            next_id += 1;
            (spawn_writer(&path, next_id), false)
        })
        .collect();
    let (mut kills, mut stops) = (0u32, 0u32);
    let end = Instant::now() + Duration::from_millis(run_ms - 500);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(rng.range(1, 40)));
        assert!(intact(&cell.load()), "torn value in the parent");
        let i = rng.below(writers.len() as u64) as usize;
        let (p, stopped) = &mut writers[i];
        if *stopped {
            // A stopped writer is resumed (its pending store must fail and be retried)
            // or killed while stopped.
            if rng.percent(50) {
                p.cont();
                *stopped = false;
            } else {
                p.kill();
                kills += 1;
                next_id += 1;
                writers[i] = (spawn_writer(&path, next_id), false);
            }
        } else if rng.percent(50) {
            p.stop();
            *stopped = true;
            stops += 1;
        } else {
            p.kill();
            kills += 1;
            next_id += 1;
            writers[i] = (spawn_writer(&path, next_id), false);
        }
    }
    // Every writer dies, some mid-store and some while stopped.
    for (p, _) in &mut writers {
        p.kill();
    }
    let t = Instant::now();
    cell.store(sealed(1)).unwrap();
    let took = t.elapsed();
    assert_eq!(cell.load(), sealed(1));
    let t = Instant::now();
    let w = cell.update(|v| *v = sealed(v[0] + 1)).unwrap();
    let took_update = t.elapsed();
    assert_eq!(cell.load(), sealed(2));
    eprintln!(
        "kills={kills} stops={stops} final store took {took:?}, final update {took_update:?} ({:?}); counters {:?}",
        w.abandoned,
        cell.counters()
    );
    assert!(
        took < Duration::from_millis(100),
        "a store after every writer died took {took:?}"
    );
    assert!(
        took_update < Duration::from_millis(100),
        "an update after every writer died took {took_update:?}"
    );
    for r in &mut readers {
        let lines = r.finish(Duration::from_secs(60));
        let f = fields(lines.last().unwrap());
        eprintln!("reader: {}", lines.last().unwrap());
        assert_eq!(f["torn"], "0", "a reader saw a torn value");
        assert!(f["reads"].parse::<u64>().unwrap() > 1000);
    }
    assert!(
        kills + stops > 10,
        "too few faults injected: {kills} kills, {stops} stops"
    );
}
