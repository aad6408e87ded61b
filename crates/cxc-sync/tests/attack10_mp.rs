//! Attacks on the documented promises of SharedRwLock, SharedCell and the mapped-file
//! election (docs/shared-rwlock.md, seqlock.md, shared-cell.md, leader-election.md) with
//! real processes: live writers next to killed ones (never evicted as dead), a writer
//! stopped at a random point of a write loop (evicted, never visible), a stopped reader
//! (never evicted, blocks writers until it dies), a forked child storing through its
//! parent's cell handle, and a leader stopped past its lease with no standby.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`).
#![cfg(not(cxc_loom))]

use std::time::{Duration, Instant};

use cxc_sync::{
    ElectionConfig, ElectionError, Elector, FencedFile, FencedResource, MmapElection, Renewal,
    RwLockOptions, SharedCell, SharedRwLock, WriteGuardError,
};
use cxc_testkit::{
    Proc, Rng, RoleCommand, arg, fields, intact, num, path_arg, play_role, report, sealed, serial,
    sleep_forever, wait_for_path,
};

const REPORT_WAIT: Duration = Duration::from_secs(20);
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

fn counter(lock: &SharedRwLock<[u64; 4]>, name: &str) -> u64 {
    lock.counters()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or_else(|| panic!("no counter {name}"), |(_, v)| v)
}

// ---------------------------------------------------------------------------------------
// SharedRwLock
// ---------------------------------------------------------------------------------------

const RW_LIVE: &str = "rwlock_live_writers_are_never_evicted_when_a_dead_writer_is_reclaimed";

/// "Dead writer: waiters see `WRITER` naming a slot whose process is gone and evict it at
/// once"; "A writer that makes no progress for the grace period while others wait ... is
/// evicted" (docs/shared-rwlock.md). With a grace of 30 s only a dead writer may ever be
/// evicted. A victim process takes the write lock and is SIGKILLed, 30 times, while three
/// live writer processes take the lock in a loop and write under it at once; 16 idle
/// processes fill the holder table, so a waiter's `reclaim_dead` scan is long. A live
/// writer whose guard reports `Lost` was evicted while it ran: its section overlapped the
/// next writer's.
// Found (fixed since): a live, progressing writer was evicted as "dead" right after it claimed (Watch::check evicted the *current* word after reclaim_dead); docs/shared-rwlock.md "Dead writer: waiters ... evict it at once" / grace 30 s
#[test]
fn rwlock_live_writers_are_never_evicted_when_a_dead_writer_is_reclaimed() {
    fn role_idle() {
        let _lock = SharedRwLock::<[u64; 4]>::open(path_arg("path")).unwrap();
        report("ready");
        sleep_forever();
    }
    fn role_victim() {
        let lock = SharedRwLock::<[u64; 4]>::open(path_arg("path")).unwrap();
        let g = lock.write();
        g.write([9, 9, 9, 9]).unwrap();
        report(format!("held token={}", g.token()));
        sleep_forever();
    }
    fn role_writer() {
        let lock = SharedRwLock::<[u64; 4]>::open(path_arg("path")).unwrap();
        let id: u64 = arg("id").parse().unwrap();
        let stop = path_arg("stop");
        report("ready");
        let (mut sections, mut lost, mut tokens) = (0u64, 0u64, Vec::new());
        while !stop.exists() {
            let g = lock.write();
            let t = g.token();
            let mut ok = g.read().is_ok();
            for k in 0..4 {
                ok &= g.write([id, sections, k, t]).is_ok();
                std::hint::spin_loop();
            }
            ok &= g.unlock().is_ok();
            sections += 1;
            if !ok {
                lost += 1;
                if tokens.len() < 8 {
                    tokens.push(t);
                }
            }
        }
        report(format!(
            "sections={sections} lost={lost} lost_tokens={tokens:?}"
        ));
    }
    play_role!(role_idle, role_victim, role_writer);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.rw");
    let stop = dir.path().join("stop");
    let opts = RwLockOptions::default()
        .grace(Duration::from_secs(30))
        .holders(64);
    let lock = SharedRwLock::<[u64; 4]>::create_with(&path, [0; 4], &opts).unwrap();
    // The first victim gets the slot after the parent's; every later one gets it again
    // (the lowest free slot once its predecessor is reclaimed).
    let mut victim = RoleCommand::new(RW_LIVE, "victim")
        .arg("path", &path)
        .spawn();
    victim.next_report(REPORT_WAIT);
    let mut idle: Vec<Proc> = (0..16)
        .map(|_| RoleCommand::new(RW_LIVE, "idle").arg("path", &path).spawn())
        .collect();
    for p in &mut idle {
        p.next_report(REPORT_WAIT);
    }
    let mut writers: Vec<Proc> = (0..3)
        .map(|i| {
            RoleCommand::new(RW_LIVE, "writer")
                .arg("path", &path)
                .arg("stop", &stop)
                .arg("id", i.to_string())
                .spawn()
        })
        .collect();
    for w in &mut writers {
        w.next_report(REPORT_WAIT);
    }
    let rounds = 30;
    for round in 0..rounds {
        if round > 0 {
            victim = RoleCommand::new(RW_LIVE, "victim")
                .arg("path", &path)
                .spawn();
            victim.next_report(REPORT_WAIT);
        }
        // The writers are blocked behind the victim now (sleeping, checking every 20 ms).
        std::thread::sleep(Duration::from_millis(30));
        victim.kill();
        std::thread::sleep(Duration::from_millis(60));
    }
    std::fs::write(&stop, b"stop").unwrap();
    let mut lost = 0;
    let mut lines = Vec::new();
    for w in &mut writers {
        let r = w.finish(CHILD_DEADLINE);
        let line = r.last().unwrap().clone();
        lost += num(&line, "lost");
        lines.push(line);
    }
    let dead = counter(&lock, "evicted_dead");
    let stale = counter(&lock, "evicted_stale");
    println!(
        "{rounds} victims killed; writers: {lines:?}; evicted_dead={dead} evicted_stale={stale}"
    );
    assert_eq!(
        stale, 0,
        "a writer was evicted as stale with a grace of 30 s"
    );
    assert_eq!(
        lost, 0,
        "live writers lost their write lock while running ({rounds} killed victims, \
         evicted_dead={dead}): {lines:?}"
    );
    assert!(
        dead <= rounds,
        "{dead} dead evictions for {rounds} dead writers"
    );
}

const RW_LOOP: &str =
    "rwlock_writer_stopped_anywhere_in_a_write_loop_never_publishes_after_eviction";

/// "A writer that makes no progress for the grace period while others wait (a stopped
/// process ...) is evicted; its later writes are refused and none of its bytes ever
/// becomes visible" (docs/shared-rwlock.md). A writer process writes marked values in a
/// tight loop (so the stop lands anywhere: in the fill, before or after the publish CAS);
/// the parent stops it at a random moment, takes the lock after the grace, writes its own
/// value and releases; the writer continues. Its next write must be refused, and the
/// parent's value must stay (checked for 300 ms of reads); the quarantined buffer must
/// come back (20 more writes). Eight rounds.
#[test]
fn rwlock_writer_stopped_anywhere_in_a_write_loop_never_publishes_after_eviction() {
    fn role_looper() {
        let lock = SharedRwLock::<[u64; 4]>::open(path_arg("path")).unwrap();
        let g = lock.write();
        report(format!("held token={}", g.token()));
        let mut n = 0u64;
        let res = loop {
            n += 1;
            if let Err(e) = g.write([0xBAD, n, !n, n ^ 0xBAD]) {
                break e;
            }
        };
        let unlock = g.unlock();
        report(format!(
            "writes={n} write_lost={} unlock_lost={}",
            matches!(res, WriteGuardError::Lost { .. }),
            matches!(unlock, Err(WriteGuardError::Lost { .. }))
        ));
    }
    play_role!(role_looper);
    let _s = serial();
    let mut rng = Rng::for_test();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loop.rw");
    let opts = RwLockOptions::default()
        .grace(Duration::from_millis(150))
        .holders(8);
    let lock = SharedRwLock::<[u64; 4]>::create_with(&path, [1; 4], &opts).unwrap();
    let mut bad = Vec::new();
    for round in 0..8u64 {
        let mut w = RoleCommand::new(RW_LOOP, "looper")
            .arg("path", &path)
            .spawn();
        let rep = w.next_report(REPORT_WAIT);
        let old = num(&rep, "token");
        std::thread::sleep(Duration::from_micros(rng.range(0, 20_000)));
        w.stop();
        w.wait_state('T', Duration::from_secs(5));
        let t = Instant::now();
        let g = lock
            .write_timeout(Duration::from_secs(10))
            .expect("a stopped writer wedged the lock");
        let waited = t.elapsed();
        assert!(g.token() > old);
        let mine = [round, round + 1, round + 2, 0x600D];
        g.write(mine).unwrap();
        g.unlock().unwrap();
        w.cont();
        let until = Instant::now() + Duration::from_millis(300);
        let mut reads = 0u64;
        while Instant::now() < until {
            let v = lock.read().get();
            reads += 1;
            if v != mine {
                bad.push(format!("round {round}: read {v:x?} after the eviction"));
                break;
            }
        }
        let rep = w.finish(CHILD_DEADLINE);
        let f = fields(&rep[0]);
        println!(
            "round {round}: waited {waited:?}, {reads} reads, looper {:?}",
            rep[0]
        );
        if f["write_lost"] != "true" || f["unlock_lost"] != "true" {
            bad.push(format!(
                "round {round}: evicted writer not refused: {}",
                rep[0]
            ));
        }
        assert!(
            waited >= Duration::from_millis(140),
            "evicted before the grace: {waited:?}"
        );
        for i in 0..20 {
            let g = lock.write();
            g.write([i; 4])
                .unwrap_or_else(|e| panic!("round {round}: write {i} after the eviction: {e}"));
            g.write(mine).unwrap();
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

const RW_STOPPED_READER: &str =
    "rwlock_stopped_reader_is_never_evicted_and_a_killed_one_frees_at_once";

/// "Stopped reader: not evicted ... A reader stopped forever blocks writers, as with any
/// rwlock; a reader that dies does not" (docs/shared-rwlock.md). A reader process is
/// stopped holding its read lock, grace 100 ms: a writer must not get in for 8 graces
/// (its `write_timeout` gives its claim up, so readers get in again); killed while
/// stopped, the writer gets in at once.
#[test]
fn rwlock_stopped_reader_is_never_evicted_and_a_killed_one_frees_at_once() {
    fn role_reader() {
        let lock = SharedRwLock::<[u64; 4]>::open(path_arg("path")).unwrap();
        let g = lock.read();
        report(format!("held v={}", g.get()[0]));
        sleep_forever();
    }
    play_role!(role_reader);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sr.rw");
    let opts = RwLockOptions::default()
        .grace(Duration::from_millis(100))
        .holders(8);
    let lock = SharedRwLock::<[u64; 4]>::create_with(&path, [7; 4], &opts).unwrap();
    let mut r = RoleCommand::new(RW_STOPPED_READER, "reader")
        .arg("path", &path)
        .spawn();
    assert_eq!(num(&r.next_report(REPORT_WAIT), "v"), 7);
    r.stop();
    r.wait_state('T', Duration::from_secs(5));
    let t = Instant::now();
    let got = lock
        .write_timeout(Duration::from_millis(800))
        .map(|g| g.token());
    assert!(
        got.is_none(),
        "a writer got in (token {got:?}) after {:?} while a stopped reader held its read lock",
        t.elapsed()
    );
    // The timed-out writer gave its claim up: readers are not locked out.
    assert_eq!(lock.try_read().map(|g| g.get()), Some([7; 4]));
    r.kill();
    let t = Instant::now();
    let g = lock
        .write_timeout(Duration::from_secs(5))
        .expect("a killed reader wedged the lock");
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "took {took:?} after the reader died"
    );
    g.write([8; 4]).unwrap();
}

const RW_QUAR: &str = "rwlock_buffers_of_seven_stopped_evicted_writers_come_back_when_they_die";

/// The state word at file offset 128 (docs/shared-rwlock.md, "Memory layout").
fn state_word(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, 128)
        .unwrap();
    u64::from_ne_bytes(b)
}

/// "Its staging buffer was quarantined at eviction ... `reap_quarantine` frees it once
/// its process is dead"; guard operations return `WriteGuardError::NoBuffer` when every
/// buffer is published or quarantined (docs/shared-rwlock.md). Seven writer processes
/// are stopped holding the lock one after the other and evicted (seven of the eight
/// buffers quarantined for live writers): the next writer gets `NoBuffer`, never another
/// writer's buffer. Once the seven are SIGKILLed, the same guard's write succeeds and no
/// buffer stays quarantined.
#[test]
fn rwlock_buffers_of_seven_stopped_evicted_writers_come_back_when_they_die() {
    fn role_staller() {
        let lock = SharedRwLock::<[u64; 4]>::open(path_arg("path")).unwrap();
        let g = lock.write();
        let i: u64 = arg("i").parse().unwrap();
        g.write([0xBAD, i, 0, 0]).unwrap();
        report(format!("held token={}", g.token()));
        loop {
            // Writes into its quarantined buffer once continued (never: it is killed).
            let _ = g.write([0xBAD, i, 1, 1]);
            std::hint::spin_loop();
        }
    }
    play_role!(role_staller);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q.rw");
    let opts = RwLockOptions::default()
        .grace(Duration::from_millis(100))
        .holders(16);
    let lock = SharedRwLock::<[u64; 4]>::create_with(&path, [1; 4], &opts).unwrap();
    let mut stallers = Vec::new();
    for i in 0..7u64 {
        let mut w = RoleCommand::new(RW_QUAR, "staller")
            .arg("path", &path)
            .arg("i", i.to_string())
            .spawn();
        w.next_report(REPORT_WAIT);
        w.stop();
        w.wait_state('T', Duration::from_secs(5));
        let g = lock
            .write_timeout(Duration::from_secs(10))
            .expect("a stopped writer wedged the lock");
        if i < 6 {
            g.write([2, i, 0, 0])
                .unwrap_or_else(|e| panic!("write with {} writers quarantined: {e}", i + 1));
        }
        drop(g);
        stallers.push(w);
    }
    let q = (state_word(&path) >> 16) & 0xFF;
    assert_eq!(q.count_ones(), 7, "quarantine bits {q:#010b}");
    let g = lock.write();
    let r = g.write([3; 4]);
    assert!(
        matches!(r, Err(WriteGuardError::NoBuffer)),
        "a write with every spare buffer quarantined: {r:?}"
    );
    assert_eq!(
        lock.try_read().map(|g| g.get()).unwrap_or([5, 5, 5, 5])[0],
        5
    );
    assert!(g.is_current());
    for w in &mut stallers {
        w.kill();
    }
    g.write([4; 4])
        .expect("the dead writers' buffers did not come back");
    g.unlock().unwrap();
    assert_eq!(lock.read().get(), [4; 4]);
    let q = (state_word(&path) >> 16) & 0xFF;
    assert_eq!(q, 0, "buffers of dead writers still quarantined: {q:#010b}");
}

// ---------------------------------------------------------------------------------------
// SharedCell / SeqLock
// ---------------------------------------------------------------------------------------

const CELL_FORK: &str = "cell_forked_child_storing_through_the_parents_handle_never_tears";

/// "A forked child's copy of a handle sees its parent's pid in the lanes and reserves
/// slots of its own" (docs/seqlock.md); "load ... never blocks, never torn"
/// (docs/shared-cell.md). A process stores sealed values through one thread's lane, then
/// forks from that thread; parent and child store through the same handle from that
/// same (copied) lane for a second, while a reader process checks every load. Then the
/// child is SIGKILLed mid-store over and over (forked again each time): loads never tear
/// and a store after the last kill completes at once.
#[test]
fn cell_forked_child_storing_through_the_parents_handle_never_tears() {
    fn role_reader() {
        let cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
        let stop = path_arg("stop");
        report("ready");
        let (mut loads, mut torn, mut first) = (0u64, 0u64, None);
        while !stop.exists() {
            for _ in 0..1000 {
                let v = cell.load();
                loads += 1;
                if !intact(&v) {
                    torn += 1;
                    first.get_or_insert(v);
                }
            }
        }
        let first = first.map_or(0, |v: [u64; 6]| v[0]);
        report(format!(
            "loads={loads} torn={torn} first_torn_word0={first:#x}"
        ));
    }
    fn role_forker() {
        let cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
        for i in 0..10 {
            cell.store(sealed(i)).unwrap();
        }
        let until = Instant::now() + Duration::from_secs(1);
        // SAFETY: the child only stores into the cell, reports and `_exit`s.
        let child = unsafe { libc::fork() };
        let base: u64 = if child == 0 { 2 << 40 } else { 1 << 40 };
        let mut n = 0u64;
        let mut failed = 0u64;
        while Instant::now() < until {
            n += 1;
            failed += u64::from(cell.store(sealed(base + n)).is_err());
        }
        if child == 0 {
            report(format!("CHILD stores={n} failed={failed}"));
            // SAFETY: ends the forked child without the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(child, &mut status, 0) };
        report(format!("PARENT stores={n} failed={failed}"));
        // Now children killed mid-store, forked again and again from this thread.
        let mut kills = 0;
        for round in 0..40u64 {
            // SAFETY: as above; the child stores until it is killed.
            let child = unsafe { libc::fork() };
            if child == 0 {
                let mut k = 0u64;
                loop {
                    k += 1;
                    let _ = cell.store(sealed((3 << 40) + (round << 20) + k));
                }
            }
            for _ in 0..2000 {
                cell.store(sealed((4 << 40) + round)).unwrap();
            }
            // SAFETY: `child` is our child, not reaped yet.
            unsafe {
                libc::kill(child, libc::SIGKILL);
                libc::waitpid(child, &mut status, 0);
            }
            kills += 1;
        }
        let t = Instant::now();
        let ok = cell.store(sealed(5 << 40)).is_ok();
        let took = t.elapsed().as_micros();
        report(format!("FINAL kills={kills} store_ok={ok} took_us={took}"));
    }
    play_role!(role_reader, role_forker);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fork.cell");
    let stop = dir.path().join("stop");
    let cell = SharedCell::<[u64; 6]>::create(&path, sealed(0)).unwrap();
    let mut reader = RoleCommand::new(CELL_FORK, "reader")
        .arg("path", &path)
        .arg("stop", &stop)
        .spawn();
    reader.next_report(REPORT_WAIT);
    let mut forker = RoleCommand::new(CELL_FORK, "forker")
        .arg("path", &path)
        .spawn();
    let reports = forker.finish(CHILD_DEADLINE);
    std::fs::write(&stop, b"stop").unwrap();
    let r = reader.finish(CHILD_DEADLINE);
    println!("forker: {reports:?}\nreader: {r:?}");
    let mut own_torn = 0;
    for _ in 0..100_000 {
        own_torn += u64::from(!intact(&cell.load()));
    }
    let child = reports.iter().find(|l| l.starts_with("CHILD")).unwrap();
    let parent = reports.iter().find(|l| l.starts_with("PARENT")).unwrap();
    let fin = reports.iter().find(|l| l.starts_with("FINAL")).unwrap();
    assert_eq!(num(&r[0], "torn"), 0, "torn loads: {r:?}");
    assert_eq!(own_torn, 0);
    assert!(num(child, "stores") > 0 && num(parent, "stores") > 0);
    assert_eq!(
        (num(child, "failed"), num(parent, "failed")),
        (0, 0),
        "{reports:?}"
    );
    assert_eq!(fields(fin)["store_ok"], "true", "{fin}");
    assert!(
        num(fin, "took_us") < 100_000,
        "the final store waited: {fin}"
    );
    let v = cell.load();
    assert!(intact(&v) && v[0] == 5 << 40, "last store lost: {v:x?}");
}

const CELL_UPDATES: &str = "cell_updates_of_stopped_updaters_are_counted_exactly_once";

/// "`update` is an atomic read-modify-write"; "A superseded holder cannot publish over a
/// newer value: its CAS expects the `pub_word` it read"; S5 "an update is atomic"
/// (docs/seqlock.md). Three processes increment a sealed counter with `update` (stall
/// timeout 2 ms) for 2 s while the parent SIGSTOPs and SIGCONTs them at random (so
/// updaters are stopped holding the claim, between their read and their CAS, and are
/// superseded): the final counter must equal the number of `update`s that returned `Ok`
/// (none lost, none published after being refused), and no load is torn.
#[test]
fn cell_updates_of_stopped_updaters_are_counted_exactly_once() {
    fn role_updater() {
        let mut cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
        cell.set_stall_timeout(Duration::from_millis(2));
        let stop = path_arg("stop");
        report("ready");
        let (mut ok, mut superseded, mut abandoned, mut torn) = (0u64, 0u64, 0u64, 0u64);
        while !stop.exists() {
            let mut input_torn = false;
            match cell.update(|v| {
                input_torn = !intact(v);
                *v = sealed(v[0] + 1);
            }) {
                Ok(w) => {
                    ok += 1;
                    abandoned += u64::from(w.abandoned.is_some());
                }
                Err(_) => superseded += 1,
            }
            torn += u64::from(input_torn);
        }
        report(format!(
            "ok={ok} superseded={superseded} abandoned={abandoned} torn={torn}"
        ));
    }
    play_role!(role_updater);
    let _s = serial();
    let mut rng = Rng::for_test();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("upd.cell");
    let stop = dir.path().join("stop");
    let cell = SharedCell::<[u64; 6]>::create(&path, sealed(0)).unwrap();
    let mut ups: Vec<Proc> = (0..3)
        .map(|_| {
            RoleCommand::new(CELL_UPDATES, "updater")
                .arg("path", &path)
                .arg("stop", &stop)
                .spawn()
        })
        .collect();
    for u in &mut ups {
        u.next_report(REPORT_WAIT);
    }
    let until = Instant::now() + Duration::from_secs(2);
    let (mut stops, mut torn) = (0u64, 0u64);
    while Instant::now() < until {
        let i = rng.below(3) as usize;
        ups[i].stop();
        stops += 1;
        let pause = Instant::now() + Duration::from_micros(rng.range(1_000, 30_000));
        while Instant::now() < pause {
            torn += u64::from(!intact(&cell.load()));
        }
        ups[i].cont();
        std::thread::sleep(Duration::from_micros(rng.range(0, 5_000)));
    }
    std::fs::write(&stop, b"stop").unwrap();
    let mut sum = 0;
    let mut lines = Vec::new();
    for u in &mut ups {
        let r = u.finish(CHILD_DEADLINE);
        let line = r.last().unwrap().clone();
        sum += num(&line, "ok");
        torn += num(&line, "torn");
        lines.push(line);
    }
    let v = cell.load();
    println!("{stops} stops; final {}; updaters {lines:?}", v[0]);
    assert_eq!(torn, 0, "torn values: {lines:?}");
    assert!(intact(&v));
    assert_eq!(
        v[0], sum,
        "the counter is {} after {sum} successful updates: {lines:?}",
        v[0]
    );
}

// ---------------------------------------------------------------------------------------
// Leader election (mapped file)
// ---------------------------------------------------------------------------------------

const EL_STOP: &str = "election_leader_stopped_past_its_lease_without_a_standby_is_over";

/// "`renew`: `Err(Lost)` once superseded, or when the previous renewal is older than the
/// lease duration (the leader then resigns so a standby can lead at once)";
/// "`is_current`: asks the backend"; tokens "strictly greater for every later term"
/// (docs/leader-election.md). A leader (lease 150 ms) is SIGSTOPped for 500 ms with no
/// standby at all, then continued: `is_current` must be false although nobody replaced
/// it, `renew` must report `Lost`, and a standby that campaigns right after must be
/// elected at once with a larger token; the old leader's fenced write after that is
/// refused.
#[test]
fn election_leader_stopped_past_its_lease_without_a_standby_is_over() {
    fn role_leader() {
        let lease = Duration::from_millis(150);
        let backend = MmapElection::create_or_open(path_arg("path"), lease).unwrap();
        let cfg = ElectionConfig::new("old")
            .lease_duration(lease)
            .renewal(Renewal::Progress);
        let el = Elector::new(backend, cfg).unwrap();
        let res = FencedFile::open(path_arg("res")).unwrap();
        let l = el
            .campaign(Duration::from_secs(5))
            .unwrap()
            .expect("elected");
        let token = l.token();
        assert!(res.write(token, b"old").unwrap());
        l.renew().unwrap();
        report(format!("leading token={token}"));
        // The parent stops this process here for longer than the lease.
        assert!(wait_for_path(&path_arg("go"), CHILD_DEADLINE));
        let current = l.is_current().unwrap();
        let renewed = matches!(l.renew(), Err(ElectionError::Lost { .. }));
        report(format!("current={current} renew_lost={renewed}"));
        assert!(wait_for_path(&path_arg("go2"), CHILD_DEADLINE));
        let wrote = res.write(token, b"old-late").unwrap();
        report(format!("late_write={wrote}"));
    }
    play_role!(role_leader);
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("election");
    let res = dir.path().join("res");
    let (go, go2) = (dir.path().join("go"), dir.path().join("go2"));
    let mut old = RoleCommand::new(EL_STOP, "leader")
        .arg("path", &path)
        .arg("res", &res)
        .arg("go", &go)
        .arg("go2", &go2)
        .spawn();
    let old_token = num(&old.next_report(REPORT_WAIT), "token");
    old.stop();
    old.wait_state('T', Duration::from_secs(5));
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(&go, b"go").unwrap();
    old.cont();
    let rep = old.next_report(REPORT_WAIT);
    // A standby arrives only now.
    let lease = Duration::from_millis(150);
    let backend = MmapElection::create_or_open(&path, lease).unwrap();
    let el = Elector::new(backend, ElectionConfig::new("new").lease_duration(lease)).unwrap();
    let t = Instant::now();
    let l = el
        .campaign(Duration::from_secs(5))
        .unwrap()
        .expect("standby never elected");
    let took = t.elapsed();
    let store = FencedFile::open(&res).unwrap();
    assert!(store.write(l.token(), b"new").unwrap());
    std::fs::write(&go2, b"go").unwrap();
    let late = old.finish(CHILD_DEADLINE);
    let (_, data) = store.read().unwrap();
    println!(
        "old: {rep} / {late:?}; standby elected after {took:?}, token {}",
        l.token()
    );
    let f = fields(&rep);
    assert_eq!(
        f["current"], "false",
        "a leader past its lease says it is current: {rep}"
    );
    assert_eq!(f["renew_lost"], "true", "{rep}");
    assert!(
        l.token() > old_token,
        "token {} after {old_token}",
        l.token()
    );
    assert!(
        took < Duration::from_millis(100),
        "the standby waited {took:?} although the late leader resigned"
    );
    assert_eq!(fields(&late[0])["late_write"], "false", "{late:?}");
    assert_eq!(data, b"new");
}
