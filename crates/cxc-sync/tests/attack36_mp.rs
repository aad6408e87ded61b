//! attack36: the heartbeat table's fence (H3) and registration generations
//! (docs/heartbeat.md, docs/failover-watchdog.md), through the registration guards
//! (`Registration`, `OwnedRegistration`), with real processes:
//!
//! 1. An `OwnedRegistration` copied into a `fork`ed child: in the child it acts for
//!    nothing (beat, mark, clear, in_flight, unregister, its drop), nor do the seed slot
//!    calls of the child's copy of the table; the parent's registration is untouched and
//!    the child can join a slot of its own. Also moved to another thread of the parent.
//! 2. Chaos with guards: worker processes of two threads each (`join_owned` on one
//!    `Arc`), SIGSTOPped at random points of `join`/`beat`/`mark`/`clear` while a
//!    watchdog process and the parent reclaim them; after being fenced a thread re-joins
//!    (often the very slot it lost, in the same process: same pid, same identity) and
//!    keeps poking every old fenced guard it holds. No old guard may ever act (beat,
//!    mark, clear, in_flight, unregister), and a shared ledger checks each unit is
//!    accounted for exactly once (cleared by its worker or reclaimed, never both).
//! 3. A slot's generation at its documented 31-bit wrap (the owner word, both halves and
//!    `id_gen` patched with raw writes at the offsets of docs/heartbeat.md): the
//!    registration of generation 2³¹−1 is fenced, the same process re-joins the slot at
//!    the wrapped generation 1; the old guard must act for nothing, the new one must
//!    work and record its identity, and a watchdog's snapshot of the old generation must
//!    reclaim nothing of the new one; once the process is gone its idle slot is reused
//!    by OS identity (the identity recorded across the wrap).
//! 4. `join_as(pid)` on behalf of another process whose pid dies and is reused by a new
//!    process (a fresh pid namespace, `ns_last_pid`; root only, SKIPPED otherwise), on
//!    the pidfs and fallback identity paths: busy — the newcomer with the pid acts for
//!    nothing, the registrant's beats keep the slot alive, once they stop the watchdog
//!    reports it by OS identity and the registrant's guard is told `Fenced`; idle — the
//!    newcomer reuses the slot by OS identity (pass 2) and the registrant's old guard
//!    (beat, mark, drop) never touches the newcomer's registration.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock).
#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]

mod procs;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{
    EpochMode, FailoverWatchdog, HeartbeatError, HeartbeatOptions, HeartbeatTable,
    OwnedRegistration,
};
use cxc_testkit::{Proc, Rng, RoleCommand, arg, path_arg, play_role, report, serial};
use procs::{mount_own_proc, nsroot, run_reuse_test, spawn, spawn_with_pid, wait_line, words};

const REPORT_WAIT: Duration = Duration::from_secs(20);

fn me() -> u32 {
    std::process::id()
}

fn child_rng(salt: u64) -> Rng {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Rng::new(cxc_testkit::mix(
        u64::from(me()) ^ (t << 20) ^ salt.wrapping_mul(0x9E37),
    ))
}

fn is_fenced_err<T: std::fmt::Debug>(r: &Result<T, HeartbeatError>) -> bool {
    matches!(r, Err(HeartbeatError::Fenced { .. }))
}

// ---------------------------------------------------------------------------------------
// 1. An OwnedRegistration in a forked child.
// ---------------------------------------------------------------------------------------

const FORK: &str = "owned_registration_copied_into_a_forked_child_acts_for_nothing";

/// "The handle's memory of its registrations is valid only in the process that made
/// them: a child made by `fork` starts afresh"; "A registration guard ... acts only for
/// the registration it made"; "A handle that did not register a slot acts for it only
/// when the slot is a live registration whose recorded identity is this very process's".
#[test]
fn owned_registration_copied_into_a_forked_child_acts_for_nothing() {
    fn role_forker() {
        let t = Arc::new(HeartbeatTable::open(path_arg("path"), 4).unwrap());
        let reg = Arc::clone(&t).join_owned().unwrap();
        let slot = reg.slot();
        reg.mark_in_flight(5).unwrap();
        reg.mark_in_flight(40).unwrap();
        // Moved to another thread of this process: still ours.
        let reg = std::thread::spawn(move || {
            reg.beat().unwrap();
            reg.mark_in_flight(41).unwrap();
            reg.clear_in_flight(41).unwrap();
            reg
        })
        .join()
        .unwrap();
        let want = (1u64 << 5) | (1 << 40);
        assert_eq!(reg.in_flight(), Some(want));
        // SAFETY: fork in a role process; the child only uses the table (atomics on a
        // shared mapping), the identity cache and plain allocations, then `_exit`s; no
        // other thread of this process holds a lock the child needs (the helper thread
        // above was joined).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let mut bad: Vec<String> = Vec::new();
            let mut check = |ok: bool, what: &str| {
                if !ok {
                    bad.push(what.to_string());
                }
            };
            check(is_fenced_err(&reg.beat()), "child: reg.beat() acted");
            check(
                is_fenced_err(&reg.mark_in_flight(7)),
                "child: reg.mark_in_flight(7) acted",
            );
            check(
                is_fenced_err(&reg.clear_in_flight(5)),
                "child: reg.clear_in_flight(5) acted",
            );
            check(
                is_fenced_err(&reg.clear_in_flight(40)),
                "child: reg.clear_in_flight(40) acted",
            );
            check(reg.in_flight().is_none(), "child: reg.in_flight() answered");
            check(!t.beat(slot), "child: table.beat(slot) acted");
            check(
                !t.mark_in_flight(slot, 9),
                "child: table.mark_in_flight acted",
            );
            check(
                !t.clear_in_flight(slot, 5),
                "child: table.clear_in_flight acted",
            );
            // Its own registration works, in another slot.
            match Arc::clone(&t).join_owned() {
                Ok(mine) => {
                    check(mine.slot() != slot, "child: joined the parent's live slot");
                    check(mine.mark_in_flight(3).is_ok(), "child: own mark failed");
                    check(mine.clear_in_flight(3).is_ok(), "child: own clear failed");
                    check(mine.unregister(), "child: own unregister failed");
                }
                Err(e) => check(false, &format!("child: join failed: {e:?}")),
            }
            check(!t.unregister(slot), "child: table.unregister(slot) acted");
            let copy: OwnedRegistration = reg;
            check(!copy.unregister(), "child: copy.unregister() acted");
            let line = if bad.is_empty() {
                "CHILD ok=1\n".to_string()
            } else {
                format!("CHILD ok=0 bad={}\n", bad.join(";").replace(' ', "_"))
            };
            let _ = std::fs::write(path_arg("out"), line);
            // SAFETY: leave the forked child at once, running no destructor of the
            // parent's state (a drop of anything would be the attack itself, already done
            // explicitly above).
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(r, pid);
        let child = std::fs::read_to_string(path_arg("out")).unwrap_or_default();
        let snap = t.snapshot(slot).unwrap();
        let after = format!(
            "in_flight={:?} beat={:?} fenced={} pid_ok={} bits={:#x}",
            reg.in_flight(),
            reg.beat(),
            snap.fenced,
            snap.pid == me(),
            snap.in_flight_bitmap
        );
        report(format!("PARENT {} {after}", child.trim()));
        assert_eq!(reg.in_flight(), Some(want), "{after}");
        reg.clear_in_flight(5).unwrap();
        reg.clear_in_flight(40).unwrap();
        assert!(reg.unregister());
    }
    play_role!(role_forker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let table = HeartbeatTable::create(&path, 4).unwrap();
    for round in 0..3 {
        let out = d.path().join(format!("out{round}"));
        let mut p = RoleCommand::new(FORK, "forker")
            .arg("path", &path)
            .arg("out", &out)
            .spawn();
        let line = p.next_report(REPORT_WAIT);
        eprintln!("round {round}: {line}");
        let st = p
            .wait_timeout(Duration::from_secs(20))
            .expect("forker hung");
        assert!(st.success(), "forker failed: {line} {}", p.stderr());
        assert!(line.contains("CHILD ok=1"), "{line}");
        assert!(
            line.contains("fenced=false pid_ok=true bits=0x10000000020"),
            "{line}"
        );
    }
    for s in 0..4 {
        let snap = table.snapshot(s).unwrap();
        assert_eq!(snap.pid, 0, "slot {s} left registered: {snap:?}");
    }
}

// ---------------------------------------------------------------------------------------
// 2. Chaos with guards: stale guards of the same process poked after re-joining.
// ---------------------------------------------------------------------------------------

const CHAOS: &str = "guard_chaos_stopped_workers_old_guards_never_act_and_units_once";

const CAP: usize = 4;
const L_COUNTER: usize = 0;
const L_ORPHAN: usize = 1;
const L_STALE_OK: usize = 2;
const L_STALE_TRIES: usize = 3;
const L_SAME_SLOT_REJOIN: usize = 4;
const L_FENCED_SEEN: usize = 5;
const L_LIVE_RECLAIM: usize = 6;
/// First word of a short description of the first stale-guard violation.
const L_STALE_WHAT: usize = 8;
const L_ENTRIES: usize = 64;
const L_TOKENS: usize = 200_000;
const L_WORDS: usize = L_ENTRIES + 2 * L_TOKENS;

const ST_MARKING: u64 = 1;
const ST_MARKED: u64 = 2;
const ST_MARK_FAILED: u64 = 3;
const ST_CLEARING: u64 = 4;
const ST_CLEARED: u64 = 5;
const ST_CLEAR_FAILED: u64 = 6;

fn entry(state: u64, slot: usize, generation: u64, bit: u8) -> u64 {
    state | (u64::from(bit) << 4) | ((slot as u64) << 12) | (generation << 20)
}

fn entry_key(e: u64) -> u64 {
    e >> 4
}

/// Credits the reclaim of `bits` of registration (`slot`, `generation`) to the newest
/// token of each (slot, generation, bit).
fn record_reclaim(l: &[AtomicU64], slot: usize, generation: u64, bits: u64) {
    let n = (l[L_COUNTER].load(Ordering::SeqCst) as usize).min(L_TOKENS);
    for bit in FailoverWatchdog::iter_in_flight_bits(bits) {
        let key = entry_key(entry(0, slot, generation, bit));
        match (0..n)
            .rev()
            .find(|&t| entry_key(l[L_ENTRIES + t].load(Ordering::SeqCst)) == key)
        {
            Some(t) => {
                l[L_ENTRIES + L_TOKENS + t].fetch_add(1, Ordering::SeqCst);
            }
            None => {
                l[L_ORPHAN].fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

fn stale_violation(l: &[AtomicU64], code: u64, slot: usize, old_gen: u64, cur: u64) {
    if l[L_STALE_OK].fetch_add(1, Ordering::SeqCst) == 0 {
        l[L_STALE_WHAT].store(code, Ordering::SeqCst);
        l[L_STALE_WHAT + 1].store(slot as u64, Ordering::SeqCst);
        l[L_STALE_WHAT + 2].store(old_gen, Ordering::SeqCst);
        l[L_STALE_WHAT + 3].store(cur, Ordering::SeqCst);
    }
}

/// One worker thread: joins, works units (marks recorded in the ledger before they are
/// made), and after each fence keeps its old guards and pokes them.
fn guard_worker(t: Arc<HeartbeatTable>, l: &'static [AtomicU64], salt: u64) {
    let mut rng = child_rng(salt);
    // (guard, its generation), fenced: must never act again.
    let mut stale: Vec<(OwnedRegistration, u64)> = Vec::new();
    let mut last_slot: Option<usize> = None;
    loop {
        let reg = match Arc::clone(&t).join_owned() {
            Ok(r) => r,
            Err(_) => {
                std::thread::sleep(Duration::from_micros(300));
                continue;
            }
        };
        let slot = reg.slot();
        if last_slot == Some(slot) {
            l[L_SAME_SLOT_REJOIN].fetch_add(1, Ordering::SeqCst);
        }
        last_slot = Some(slot);
        let Some(snap) = t.snapshot(slot) else {
            stale.push((reg, u64::MAX));
            continue;
        };
        if snap.pid != me() || snap.fenced {
            // Fenced (and maybe replaced) before we looked: stale already.
            stale.push((reg, u64::MAX));
            continue;
        }
        let generation = snap.generation;
        let mut out: Vec<(usize, u8)> = Vec::new();
        loop {
            // Poke the old guards: none may act, whoever holds their slot now (often this
            // very thread, in the same slot).
            for (old, g) in &stale {
                l[L_STALE_TRIES].fetch_add(1, Ordering::SeqCst);
                let s = old.slot();
                let cur = t.snapshot(s).map_or(0, |x| x.generation);
                let bit = rng.below(64) as u8;
                if old.beat().is_ok() {
                    stale_violation(l, 1, s, *g, cur);
                }
                if old.mark_in_flight(bit).is_ok() {
                    stale_violation(l, 2, s, *g, cur);
                }
                if old.clear_in_flight(bit).is_ok() {
                    stale_violation(l, 3, s, *g, cur);
                }
                if old.in_flight().is_some() {
                    stale_violation(l, 4, s, *g, cur);
                }
            }
            if rng.percent(60) && reg.beat().is_err() {
                break;
            }
            if out.len() < 3 && (out.is_empty() || rng.percent(50)) {
                let bit = loop {
                    let b = rng.below(64) as u8;
                    if out.iter().all(|&(_, x)| x != b) {
                        break b;
                    }
                };
                let tok = l[L_COUNTER].fetch_add(1, Ordering::SeqCst) as usize;
                if tok >= L_TOKENS {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                let e = &l[L_ENTRIES + tok];
                e.store(entry(ST_MARKING, slot, generation, bit), Ordering::SeqCst);
                let r = reg.mark_in_flight(bit);
                let st = if r.is_ok() { ST_MARKED } else { ST_MARK_FAILED };
                e.store(entry(st, slot, generation, bit), Ordering::SeqCst);
                if r.is_err() {
                    break;
                }
                out.push((tok, bit));
            } else {
                let (tok, bit) = out.swap_remove(rng.below(out.len() as u64) as usize);
                let e = &l[L_ENTRIES + tok];
                e.store(entry(ST_CLEARING, slot, generation, bit), Ordering::SeqCst);
                let r = reg.clear_in_flight(bit);
                let st = if r.is_ok() {
                    ST_CLEARED
                } else {
                    ST_CLEAR_FAILED
                };
                e.store(entry(st, slot, generation, bit), Ordering::SeqCst);
                if r.is_err() {
                    break;
                }
            }
            std::thread::sleep(Duration::from_micros(rng.below(300)));
        }
        l[L_FENCED_SEEN].fetch_add(1, Ordering::SeqCst);
        // Fenced: keep the guard; it must never act again. Drop the oldest ones through
        // `unregister`, which must report it changed nothing.
        stale.push((reg, generation));
        if stale.len() > 6 {
            let (old, g) = stale.remove(0);
            let s = old.slot();
            let cur = t.snapshot(s).map_or(0, |x| x.generation);
            if old.unregister() {
                stale_violation(l, 5, s, g, cur);
            }
        }
    }
}

fn chaos_options() -> HeartbeatOptions {
    HeartbeatOptions {
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        ..HeartbeatOptions::default()
    }
}

fn reclaim_round(w: &FailoverWatchdog<'_>, t: &HeartbeatTable, l: &[AtomicU64]) {
    for (slot, snap) in w.scan().dead_slots {
        let bits = w.reclaim(slot);
        if bits != 0 {
            if let Some(after) = t.snapshot(slot)
                && after.generation == snap.generation
                && !after.fenced
            {
                l[L_LIVE_RECLAIM].fetch_add(1, Ordering::SeqCst);
            }
            record_reclaim(l, slot, snap.generation, bits);
        }
    }
}

/// heartbeat.md: "A registration guard (`Registration`, `OwnedRegistration`) acts only
/// for the registration it made: once fenced it answers `Fenced` and its drop changes
/// nothing, also after its slot went to a new registration of the same process (the
/// worker's own `join()` after being told it was fenced), whose bits it never touches";
/// H3 "a worker declared dead is fenced and told so"; failover-watchdog.md "Each bit is
/// returned by exactly one `reclaim` call".
#[test]
fn guard_chaos_stopped_workers_old_guards_never_act_and_units_once() {
    fn role_gworker() {
        let t = Arc::new(HeartbeatTable::open(path_arg("path"), CAP).unwrap());
        let l = words(&path_arg("ledger"), L_WORDS);
        let t2 = Arc::clone(&t);
        std::thread::spawn(move || guard_worker(t2, l, 2));
        report("READY");
        guard_worker(t, l, 1);
    }
    fn role_gdog() {
        let t = HeartbeatTable::open(path_arg("path"), CAP).unwrap();
        let l = words(&path_arg("ledger"), L_WORDS);
        let w = FailoverWatchdog::with_grace(&t, 25).with_os_check_interval(Duration::ZERO);
        let mut rng = child_rng(9);
        report("READY");
        loop {
            reclaim_round(&w, &t, l);
            std::thread::sleep(Duration::from_micros(rng.range(200, 2000)));
        }
    }
    play_role!(role_gworker, role_gdog);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let ledger = d.path().join("ledger");
    let l = words(&ledger, L_WORDS);
    let table = HeartbeatTable::create_with(&path, CAP, &chaos_options()).unwrap();
    let spawn = |role: &str| {
        let mut p = RoleCommand::new(CHAOS, role)
            .arg("path", &path)
            .arg("ledger", &ledger)
            .spawn();
        p.next_report(REPORT_WAIT);
        p
    };
    // Two processes of two threads: four registrations in a table of four slots, so a
    // fenced thread's re-join usually lands on a slot just reclaimed.
    let mut workers: Vec<Proc> = (0..2).map(|_| spawn("gworker")).collect();
    let mut dog = spawn("gdog");
    let w = FailoverWatchdog::with_grace(&table, 25).with_os_check_interval(Duration::ZERO);
    let mut rng = Rng::for_test();
    let started = Instant::now();
    let mut stops = 0;
    while started.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(rng.range(2, 30)));
        match rng.below(10) {
            0..=6 => {
                let i = rng.below(2) as usize;
                workers[i].stop();
                // Short (within grace) or long (past grace: fenced and reclaimed, by the
                // watchdog process or by us).
                let ms = if rng.percent(40) {
                    rng.range(1, 15)
                } else {
                    rng.range(40, 150)
                };
                let until = Instant::now() + Duration::from_millis(ms);
                while Instant::now() < until {
                    reclaim_round(&w, &table, l);
                    std::thread::sleep(Duration::from_millis(2));
                }
                workers[i].cont();
                stops += 1;
            }
            7 => {
                dog.stop();
                std::thread::sleep(Duration::from_millis(rng.range(1, 40)));
                dog.cont();
            }
            _ => reclaim_round(&w, &table, l),
        }
    }
    // The end: stop the workers where they are (a token may be mid-mark or mid-clear:
    // its state says so), then kill them and reclaim what is left.
    for p in &workers {
        p.stop();
    }
    for p in workers.iter_mut() {
        p.wait_state('T', Duration::from_secs(5));
    }
    dog.stop();
    dog.wait_state('T', Duration::from_secs(5));
    dog.kill();
    for p in workers.iter_mut() {
        p.kill();
    }
    let busy = |table: &HeartbeatTable| {
        (0..CAP).any(|s| {
            table
                .snapshot(s)
                .is_some_and(|x| x.pid != 0 && x.in_flight_bitmap != 0)
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while busy(&table) && Instant::now() < deadline {
        reclaim_round(&w, &table, l);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        !busy(&table),
        "units left in the table after the final reclaim"
    );
    let n = (l[L_COUNTER].load(Ordering::SeqCst) as usize).min(L_TOKENS);
    let mut problems: Vec<String> = Vec::new();
    let mut tally = [0u64; 8];
    let mut reclaimed = 0;
    for t in 0..n {
        let e = l[L_ENTRIES + t].load(Ordering::SeqCst);
        if e == 0 {
            continue;
        }
        let r = l[L_ENTRIES + L_TOKENS + t].load(Ordering::SeqCst);
        reclaimed += r;
        let st = e & 0xF;
        tally[st as usize] += 1;
        let what = format!(
            "unit {t} (slot {} gen {} bit {})",
            (e >> 12) & 0xFF,
            e >> 20,
            (e >> 4) & 0xFF
        );
        if r > 1 {
            problems.push(format!("{what}: reclaimed {r} times"));
        }
        match st {
            ST_CLEARED if r > 0 => problems.push(format!("{what}: cleared and reclaimed")),
            ST_MARK_FAILED if r > 0 => problems.push(format!("{what}: mark failed, reclaimed")),
            ST_MARKED | ST_CLEAR_FAILED if r == 0 => {
                problems.push(format!("{what}: held (state {st}) but never reclaimed"))
            }
            _ => {}
        }
    }
    let stale_ok = l[L_STALE_OK].load(Ordering::SeqCst);
    let summary = format!(
        "units={n} tally={tally:?} reclaimed={reclaimed} orphans={} live_reclaims={} \
         stops={stops} fences_seen={} same_slot_rejoins={} stale_tries={} stale_ok={stale_ok} \
         first_violation(code,slot,old_gen,cur_gen)=({},{},{},{})",
        l[L_ORPHAN].load(Ordering::SeqCst),
        l[L_LIVE_RECLAIM].load(Ordering::SeqCst),
        l[L_FENCED_SEEN].load(Ordering::SeqCst),
        l[L_SAME_SLOT_REJOIN].load(Ordering::SeqCst),
        l[L_STALE_TRIES].load(Ordering::SeqCst),
        l[L_STALE_WHAT].load(Ordering::SeqCst),
        l[L_STALE_WHAT + 1].load(Ordering::SeqCst),
        l[L_STALE_WHAT + 2].load(Ordering::SeqCst),
        l[L_STALE_WHAT + 3].load(Ordering::SeqCst),
    );
    eprintln!("{summary}");
    assert_eq!(stale_ok, 0, "a fenced guard acted: {summary}");
    assert!(
        problems.is_empty(),
        "{} problems, first: {:?}; {summary}",
        problems.len(),
        &problems[..problems.len().min(5)]
    );
    assert_eq!(l[L_ORPHAN].load(Ordering::SeqCst), 0, "{summary}");
    assert_eq!(l[L_LIVE_RECLAIM].load(Ordering::SeqCst), 0, "{summary}");
    // The attack happened: fences, re-joins in the same slot, stale pokes, reclaims.
    assert!(l[L_FENCED_SEEN].load(Ordering::SeqCst) >= 5, "{summary}");
    assert!(
        l[L_SAME_SLOT_REJOIN].load(Ordering::SeqCst) >= 1,
        "{summary}"
    );
    assert!(l[L_STALE_TRIES].load(Ordering::SeqCst) >= 100, "{summary}");
    assert!(reclaimed >= 5, "{summary}");
}

// ---------------------------------------------------------------------------------------
// 3. The generation wrap.
// ---------------------------------------------------------------------------------------

const WRAP: &str = "generation_wrap_old_guard_never_acts_for_the_wrapped_registration";

const GEN_MASK: u64 = 0x7FFF_FFFF;
const ID_MIXED: u64 = 1 << 32;
const SLOT0: u64 = 3008;

fn pwrite_word(path: &Path, offset: u64, v: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&v.to_le_bytes(), offset).unwrap();
}

/// The generation after `g` (31 bits, 0 skipped), as docs/heartbeat.md describes it.
fn next_gen(g: u64) -> u64 {
    match (g + 1) & GEN_MASK {
        0 => 1,
        n => n,
    }
}

/// Makes slot 0 a FREE slot (unregistered, no bits) of generation `g`, with the identity
/// record of `g` complete, as `unregister` leaves it: owner `(0, g, FENCED)`, halves
/// `(fenced tag of g, 0)`, `id_gen = g | MIXED` (docs/heartbeat.md, "Slot `i`").
fn patch_free_at(path: &Path, g: u64) {
    let tag = (g << 1) | 1;
    pwrite_word(path, SLOT0, tag);
    pwrite_word(path, SLOT0 + 16, tag << 32);
    pwrite_word(path, SLOT0 + 24, tag << 32);
    pwrite_word(path, SLOT0 + 56, g | ID_MIXED);
}

/// heartbeat.md: "Generations only grow (31 bits, wrapping after 2³¹ registrations of
/// one slot), so a watchdog acting on an old snapshot fails its CAS or its tag
/// comparison"; "once fenced it answers `Fenced` ... also after its slot went to a new
/// registration of the same process"; the identity of the new registration is
/// recorded ("Readers trust the words only when `id_gen` is the owner word's
/// generation with MIXED"), so the slot of a dead worker is reused by OS identity.
#[test]
fn generation_wrap_old_guard_never_acts_for_the_wrapped_registration() {
    fn role_wrapper() {
        let path = path_arg("path");
        let t = Arc::new(HeartbeatTable::open(&path, 1).unwrap());
        let g0: u64 = arg("g0").parse().unwrap();
        let mut out = Vec::new();
        let old = Arc::clone(&t).join_owned().unwrap();
        let s = t.snapshot(0).unwrap();
        out.push(format!(
            "old_gen={} old_known={}",
            s.generation,
            s.identity.is_known()
        ));
        assert_eq!(s.generation, next_gen(g0));
        old.mark_in_flight(3).unwrap();
        old.mark_in_flight(35).unwrap();
        // A watchdog declares it dead (stale by two manual epochs beyond grace 1).
        let w = FailoverWatchdog::with_grace(&t, 1).with_os_check_interval(Duration::MAX);
        let mut snap_old = None;
        let mut got = 0;
        for _ in 0..5 {
            for (slot, snap) in w.scan().dead_slots {
                snap_old = Some(snap);
                got |= w.reclaim(slot);
            }
            if got != 0 {
                break;
            }
        }
        let snap_old = snap_old.expect("never reported");
        out.push(format!("reclaimed={got:#x}"));
        assert_eq!(got, (1 << 3) | (1 << 35));
        assert!(is_fenced_err(&old.beat()));
        // The same process joins again: the only slot, wrapped generation.
        let new = Arc::clone(&t).join_owned().unwrap();
        let s = t.snapshot(0).unwrap();
        out.push(format!(
            "new_gen={} new_known={} new_fenced={}",
            s.generation,
            s.identity.is_known(),
            s.fenced
        ));
        new.mark_in_flight(9).unwrap();
        new.mark_in_flight(50).unwrap();
        let mut acted = Vec::new();
        if old.beat().is_ok() {
            acted.push("beat");
        }
        if old.clear_in_flight(9).is_ok() {
            acted.push("clear9");
        }
        if old.clear_in_flight(50).is_ok() {
            acted.push("clear50");
        }
        if old.mark_in_flight(12).is_ok() {
            acted.push("mark12");
        }
        if old.in_flight().is_some() {
            acted.push("in_flight");
        }
        if w.reclaim_snapshot(0, &snap_old) != 0 {
            acted.push("reclaim_snapshot_old");
        }
        if w.clear_snapshot(0, &snap_old) != 0 {
            acted.push("clear_snapshot_old");
        }
        let keep = old.unregister();
        if keep {
            acted.push("unregister");
        }
        let s = t.snapshot(0).unwrap();
        out.push(format!(
            "old_acted=[{}] after_bits={:#x} after_fenced={} new_in_flight={:?} new_beat_ok={}",
            acted.join(","),
            s.in_flight_bitmap,
            s.fenced,
            new.in_flight(),
            new.beat().is_ok()
        ));
        new.clear_in_flight(9).unwrap();
        new.clear_in_flight(50).unwrap();
        report(format!("WRAP {}", out.join(" ")));
        // Stay registered, idle: the parent checks that once this process is gone, its
        // slot is reused by OS identity (which needs the identity recorded at the wrap).
        std::mem::forget(new);
        report("IDLE");
        cxc_testkit::sleep_forever();
    }
    play_role!(role_wrapper);
    let _s = serial();
    // g0: the generation the slot is patched to (free); the registration takes g0 + 1.
    // GEN_MASK - 1: the first join gets 2³¹−1 and the re-join wraps to 1.
    for g0 in [GEN_MASK - 1, GEN_MASK - 2, GEN_MASK] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("hb");
        let table = HeartbeatTable::create(&path, 1).unwrap();
        patch_free_at(&path, g0);
        let s = table.snapshot(0).unwrap();
        assert_eq!((s.pid, s.generation, s.fenced), (0, g0, false), "{s:?}");
        let mut p = RoleCommand::new(WRAP, "wrapper")
            .arg("path", &path)
            .arg("g0", g0.to_string())
            .spawn();
        let line = p.next_report(REPORT_WAIT);
        eprintln!("g0={g0:#x}: {line}");
        let idle = p.next_report(REPORT_WAIT);
        assert_eq!(idle, "IDLE", "{line}");
        let want_new = next_gen(next_gen(g0));
        assert!(line.contains("old_known=true"), "{line}");
        assert!(
            line.contains(&format!(
                "new_gen={want_new} new_known=true new_fenced=false"
            )),
            "g0={g0:#x}: {line}"
        );
        assert!(line.contains("old_acted=[]"), "g0={g0:#x}: {line}");
        assert!(
            line.contains("after_bits=0x4000000000200 after_fenced=false"),
            "g0={g0:#x}: {line}"
        );
        assert!(line.contains("new_beat_ok=true"), "{line}");
        // Gone: its idle live slot is reused at once by OS identity (register pass 2).
        p.kill();
        let reg = table.join_as(me());
        assert!(
            reg.is_ok(),
            "g0={g0:#x}: the idle slot of a dead process was not reused after the wrap: {:?} {:?}",
            reg.err(),
            table.snapshot(0)
        );
        let s = table.snapshot(0).unwrap();
        assert!(s.identity.is_known(), "{s:?}");
    }
}

// ---------------------------------------------------------------------------------------
// 4. join_as on behalf of a pid that dies and is reused.
// ---------------------------------------------------------------------------------------

fn join_as_run(test: &str, fallback: bool) {
    match cxc_testkit::role().as_deref() {
        Some("nsroot") => nsroot(test),
        Some("scenario") => join_as_scenario(test, fallback),
        Some("subject") => {
            report("READY");
            cxc_testkit::sleep_forever();
        }
        Some("newcomer") => join_as_newcomer(),
        Some(other) => panic!("unknown role {other}"),
        None => run_reuse_test(test, fallback),
    }
}

/// Role: a new process that got the dead subject's pid. `mode=busy`: the slot call
/// results on the registrant's slot. `mode=idle`: joins (the table has one slot, held
/// by the dead subject's idle registration), marks bit 9, and reports after the
/// registrant poked its old guard.
fn join_as_newcomer() {
    let t = HeartbeatTable::open_any(procs::dir().join("hb")).unwrap();
    let slot: usize = arg("slot").parse().unwrap();
    if arg("mode") == "busy" {
        report(format!(
            "RESULT beat={} mark={} clear={} unregister={}",
            t.beat(slot),
            t.mark_in_flight(slot, 9),
            t.clear_in_flight(slot, 4),
            t.unregister(slot)
        ));
        cxc_testkit::sleep_forever();
    }
    let reg = t.join();
    let line = match &reg {
        Ok(r) => {
            let m = r.mark_in_flight(9).is_ok();
            format!("JOINED slot={} mark={m}", r.slot())
        }
        Err(e) => format!("JOINED err={e:?}"),
    };
    report(line);
    // Wait for the registrant to poke (and drop) its old guard, then look.
    cxc_testkit::child_wait_for_path(&procs::dir().join("poked"), Duration::from_secs(30));
    if let Ok(r) = &reg {
        report(format!(
            "AFTER in_flight={:?} beat={}",
            r.in_flight(),
            r.beat().is_ok()
        ));
    }
    cxc_testkit::sleep_forever();
}

fn join_as_scenario(test: &str, fallback: bool) {
    mount_own_proc();
    assert_eq!(cxc_sync::liveness::fallback_active(), fallback);
    let dir = procs::dir();
    // Busy: a registration made for the subject, with a unit, driven by this process.
    {
        let table = HeartbeatTable::create(dir.join("hb"), 2).unwrap();
        let mut subject = spawn(test, "subject", &dir, &[]);
        wait_line(&mut subject, "READY");
        let spid = subject.pid();
        let reg = table.join_as(spid).unwrap();
        let slot = reg.slot();
        reg.mark_in_flight(4).unwrap();
        let recorded = table.snapshot(slot).unwrap().identity;
        assert!(recorded.is_known() && recorded.pid == spid, "{recorded:?}");
        subject.kill();
        // Past the fallback path's 10 ms start-time tick.
        std::thread::sleep(Duration::from_millis(30));
        let mut newcomer = spawn_with_pid(
            spid,
            test,
            "newcomer",
            &[("slot", &slot.to_string()), ("mode", "busy")],
        );
        let line = wait_line(&mut newcomer, "RESULT");
        assert_eq!(
            line, "RESULT beat=false mark=false clear=false unregister=false",
            "fallback={fallback}: the process that got the subject's pid acted for its slot"
        );
        let w = FailoverWatchdog::with_grace(&table, 1000).with_os_check_interval(Duration::ZERO);
        // While the registrant beats, the slot is not silent: not reported.
        for _ in 0..5 {
            reg.beat().unwrap();
            assert!(
                w.scan().dead_slots.is_empty(),
                "fallback={fallback}: a beating registration was reported"
            );
        }
        // Silent: reported by OS identity (the subject is gone; its pid names another
        // process), within a few scans, long before the grace of 1000 epochs.
        let mut got = 0;
        for _ in 0..20 {
            for (s, _) in w.scan().dead_slots {
                got |= w.reclaim(s);
            }
            if got != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(
            got,
            1 << 4,
            "fallback={fallback}: the silent registration of a dead, pid-reused subject was \
             not reclaimed by OS identity: {:?}",
            table.snapshot(slot)
        );
        assert!(is_fenced_err(&reg.beat()), "fallback={fallback}");
        assert!(is_fenced_err(&reg.mark_in_flight(5)), "fallback={fallback}");
        drop(reg);
        let s = table.snapshot(slot).unwrap();
        assert_eq!(s.in_flight_bitmap, 0, "{s:?}");
        newcomer.kill();
    }
    std::fs::remove_file(dir.join("hb")).unwrap();
    // Idle: the newcomer with the subject's pid reuses the slot by OS identity.
    {
        let table = HeartbeatTable::create(dir.join("hb"), 1).unwrap();
        let mut subject = spawn(test, "subject", &dir, &[]);
        wait_line(&mut subject, "READY");
        let spid = subject.pid();
        let reg = table.join_as(spid).unwrap();
        let old_gen = table.snapshot(0).unwrap().generation;
        subject.kill();
        std::thread::sleep(Duration::from_millis(30));
        let mut newcomer =
            spawn_with_pid(spid, test, "newcomer", &[("slot", "0"), ("mode", "idle")]);
        let line = wait_line(&mut newcomer, "JOINED");
        assert_eq!(
            line, "JOINED slot=0 mark=true",
            "fallback={fallback}: the idle slot of the dead subject was not reused by the \
             process that got its pid"
        );
        let s = table.snapshot(0).unwrap();
        assert_eq!(
            (s.pid, s.fenced, s.in_flight_bitmap),
            (spid, false, 1 << 9),
            "{s:?}"
        );
        assert_ne!(s.generation, old_gen, "{s:?}");
        // The registrant's old guard: same pid, same slot, newer generation.
        let acted = [
            reg.beat().is_ok(),
            reg.mark_in_flight(12).is_ok(),
            reg.clear_in_flight(9).is_ok(),
            reg.in_flight().is_some(),
            table.beat(0),
            table.clear_in_flight(0, 9),
        ];
        drop(reg);
        std::fs::write(dir.join("poked"), b"1").unwrap();
        let after = wait_line(&mut newcomer, "AFTER");
        assert_eq!(
            acted, [false; 6],
            "fallback={fallback}: the registrant's old guard or slot calls acted for the \
             newcomer's registration (beat, mark, clear, in_flight, table.beat, table.clear)"
        );
        assert_eq!(
            after, "AFTER in_flight=Some(512) beat=true",
            "fallback={fallback}: the old guard's drop touched the newcomer's registration"
        );
        newcomer.kill();
    }
    println!("SCENARIO OK fallback={fallback}");
}

/// heartbeat.md "Register real pids to get crash detection by OS identity"; "a
/// registration made for another pid is driven by the handle that made it"; "Pid reuse:
/// a new process that got a dead worker's pid ... cannot adopt the dead worker's slot";
/// register pass 2 ("a LIVE slot with no bits whose recorded identity is dead ... the
/// pid reused"); a fenced guard "never acts for a later one in its slot".
#[test]
fn join_as_for_a_pid_that_dies_and_is_reused() {
    join_as_run("join_as_for_a_pid_that_dies_and_is_reused", false);
}

/// As above on the fallback identity path (pid + start time).
#[test]
fn join_as_for_a_pid_that_dies_and_is_reused_fallback() {
    join_as_run("join_as_for_a_pid_that_dies_and_is_reused_fallback", true);
}
