#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack28: `HeartbeatTable` and `FailoverWatchdog` (docs/heartbeat.md,
//! docs/failover-watchdog.md) against promises no earlier test attacks, with real
//! processes:
//!
//! 1. A registrant on behalf of a dead (zombie) pid and a newcomer that reuses such slots
//!    by OS identity (register pass 2), run instruction by instruction (ptrace) into the
//!    interleaving that lost a unit: the registrant stalled between the retags of its two
//!    halves while the newcomer closes them, then retags late and marks before the
//!    newcomer's owner CAS. The registrant's unit must not be lost, nor the slot (H2, H4).
//!    Both were lost before pass 2 fenced the dead registration before closing its
//!    halves.
//! 2. A worker whose main thread exited *before* it first touched the library (its
//!    identity is computed in a half-exited process): alive, never reported, its idle
//!    slot never taken; once gone, reported by OS identity and its slots reused.
//! 3. Slots unregistered with units left (FENCED with bits), raced by three watchdog
//!    processes: reported at once whatever the grace, each unit returned exactly once,
//!    slots reused afterwards.
//! 4. Consistent snapshots (H1) read by another process while processes churn
//!    registrations and units (and are SIGSTOPped): identity, pid, bits and `last_seen`
//!    belong together and `last_seen` never goes back within a registration.
//! 5. Sibling pid namespaces: two processes that are both pid 1: neither acts for the
//!    other's slot; a dead worker of another namespace is never dead by OS identity
//!    (only staleness reclaims it). Needs root (prints SKIPPED otherwise).

mod procs;

use std::path::Path;
use std::time::{Duration, Instant};

use cxc_sync::liveness::{Identity, Liveness, liveness};
use cxc_sync::{FailoverWatchdog, HeartbeatTable};
use cxc_testkit::{
    Proc, Rng, RoleCommand, child_wait_for_path, exit_main_thread, flag, num, path_arg, read_word,
    serial, sleep_forever, wait_until,
};
use procs::{report, role};

/// File offset of heartbeat slot 0 (128-byte header + 2880-byte head; docs/heartbeat.md).
const HB_SLOT0: u64 = 3008;
/// A grace no test reaches.
const BIG: u64 = 1 << 40;
/// How long a parent waits for a child's report.
const REPORT_WAIT: Duration = Duration::from_secs(20);

fn me() -> u32 {
    std::process::id()
}

fn touch(path: &Path) {
    std::fs::write(path, b"go").expect("touch a marker");
}

fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets this process's parent-death signal.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid of a child of this process.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// Raw slot words: (owner, lo, hi).
fn raw_slot(path: &Path, slot: u64) -> (u64, u64, u64) {
    let base = HB_SLOT0 + 64 * slot;
    (
        read_word(path, base),
        read_word(path, base + 16),
        read_word(path, base + 24),
    )
}

/// Generation of an owner word or of a half's tag (bits 31..1 of the tag).
fn gen_of_owner(owner: u64) -> u64 {
    (owner >> 1) & 0x7fff_ffff
}

fn gen_of_half(half: u64) -> u64 {
    (half >> 33) & 0x7fff_ffff
}

/// Bits of a half that belong to no generation the owner word names: units nobody can
/// see (a snapshot shows a half's bits only with the owner's generation).
fn orphan_bits(path: &Path, slot: u64) -> u64 {
    let (owner, lo, hi) = raw_slot(path, slot);
    let mut orphan = 0;
    for (shift, half) in [(0, lo), (32, hi)] {
        if half & 0xffff_ffff != 0 && gen_of_half(half) != gen_of_owner(owner) {
            orphan |= (half & 0xffff_ffff) << shift;
        }
    }
    orphan
}

// ---------------------------------------------------------------------------------------
// 1. A registrant for a dead pid and a pass-2 newcomer, interleaved by a hostile scheduler.
// ---------------------------------------------------------------------------------------

/// The tracer side of a hostile scheduler: this thread ptraces one thread of a child and
/// runs it one instruction at a time.
struct Traced {
    tid: i32,
}

impl Traced {
    /// Seizes thread `tid` and stops it; `None` if ptrace is not allowed here.
    fn seize(tid: u32) -> Option<Traced> {
        let tid = tid as libc::pid_t;
        // SAFETY: ptrace requests on a thread of a child process of this test; no memory
        // of this process is handed over.
        unsafe {
            if libc::ptrace(libc::PTRACE_SEIZE, tid, 0usize, 0usize) != 0 {
                return None;
            }
            assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0usize, 0usize), 0);
        }
        let t = Traced { tid };
        t.wait();
        Some(t)
    }

    /// Waits for the next stop; returns the signal to pass on (0 for a trap or a
    /// ptrace event stop).
    fn wait(&self) -> i32 {
        let mut status = 0;
        // SAFETY: waits for a traced thread; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(self.tid, &mut status, libc::__WALL) };
        assert_eq!(r, self.tid, "waitpid: {}", std::io::Error::last_os_error());
        assert!(libc::WIFSTOPPED(status), "traced thread ended: {status:#x}");
        let sig = libc::WSTOPSIG(status);
        if status >> 16 != 0 || sig == libc::SIGTRAP {
            0
        } else {
            sig
        }
    }

    /// Runs exactly one instruction of the thread (passing on a pending signal).
    fn step(&self, pending: &mut i32) {
        // SAFETY: as in `seize`.
        let r =
            unsafe { libc::ptrace(libc::PTRACE_SINGLESTEP, self.tid, 0usize, *pending as usize) };
        assert_eq!(
            r,
            0,
            "PTRACE_SINGLESTEP: {}",
            std::io::Error::last_os_error()
        );
        *pending = self.wait();
    }

    /// Steps until `cond` holds (true) or `max` steps have run (false).
    fn step_until(&self, max: u64, mut cond: impl FnMut() -> bool) -> bool {
        let mut pending = 0;
        for _ in 0..max {
            self.step(&mut pending);
            if cond() {
                return true;
            }
        }
        false
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        // SAFETY: detaches a stopped traced thread, which then runs on.
        unsafe { libc::ptrace(libc::PTRACE_DETACH, self.tid, 0usize, 0usize) };
    }
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// One slot's words as the tracer reads them (the file, with pread).
struct Words(std::fs::File);

impl Words {
    fn at(&self, off: u64) -> u64 {
        use std::os::unix::fs::FileExt;
        let mut b = [0u8; 8];
        self.0.read_exact_at(&mut b, HB_SLOT0 + off).unwrap();
        u64::from_ne_bytes(b)
    }
    fn owner(&self) -> u64 {
        self.at(0)
    }
    fn last_seen(&self) -> u64 {
        self.at(8)
    }
    fn lo(&self) -> u64 {
        self.at(16)
    }
    fn hi(&self) -> u64 {
        self.at(24)
    }
    fn id_gen(&self) -> u64 {
        self.at(56)
    }
}

const T1: &str =
    "hb_registrant_for_a_dead_pid_that_retags_late_never_loses_a_unit_to_a_pass2_newcomer";
const T1_UNIT: u8 = 40;

// Found: the proxy's late live tag on the high half (set between the newcomer's close and
// its owner CAS) lets the proxy's mark of unit 40 land; the newcomer's CAS then succeeds,
// its retag of the half fails on the bits and it gives the slot up: unit 40 sits in a half
// of the old generation under the newcomer's owner word, invisible to every snapshot and
// scan, and the slot can never be registered again.
/// heartbeat.md, Register: "a live tag it set late on a closed half of the replacing
/// registrant (between that one's close and its retag) is overwritten by that one's
/// retag"; step 2: "*Close* both halves ... From here no one can add bits: a worker's
/// write is a CAS that needs its live tag"; pass 2 takes "a LIVE slot with no bits whose
/// recorded identity is dead"; Pitfalls: "A `false` from ... `clear_in_flight` means 'you
/// were declared dead'. Stop working on the units you held (they have been or will be
/// reassigned)"; H2 (no unit lost) and H4 ("dead slots are reused, so the table no longer
/// fills up").
///
/// One slot. Process P registers on behalf of its zombie child Z (a dead identity), marks
/// unit 40, clears it and unregisters, in a loop. Process N registers itself, in a loop
/// (the table being full, pass 2 takes P's registration when it holds no unit, Z being
/// dead). The test is the scheduler: it runs P's and N's threads instruction by
/// instruction (ptrace) into one legal interleaving: P stands between the retags of its
/// two halves; N closes the halves (the high one is still closed from before) and stands
/// before its owner CAS; P retags its high half, returns and marks unit 40; then both run
/// freely. No watchdog runs. Afterwards a watchdog must find unit 40 if P was refused its
/// clear, no half may hold bits of a generation its owner word does not name, and the slot
/// must be reusable once everyone is gone.
#[test]

fn hb_registrant_for_a_dead_pid_that_retags_late_never_loses_a_unit_to_a_pass2_newcomer() {
    fn role_proxy() {
        let path = path_arg("path");
        let stop = path_arg("stop");
        // SAFETY: the child exits at once without touching any memory.
        let z = unsafe { libc::fork() };
        assert!(z >= 0);
        if z == 0 {
            // SAFETY: ends the forked child at once.
            unsafe { libc::_exit(0) };
        }
        let z = z as u32;
        assert!(wait_until(Duration::from_secs(5), || {
            std::fs::read_to_string(format!("/proc/{z}/stat")).is_ok_and(|s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        }));
        let table = HeartbeatTable::open(&path, 1).unwrap();
        report(format!("PROXY z={z} tid={}", gettid()));
        let (mut regs, mut marks) = (0u64, 0u64);
        let t0 = Instant::now();
        let mut lost = String::new();
        while lost.is_empty() && !stop.exists() && t0.elapsed() < Duration::from_secs(60) {
            let Ok(slot) = table.register(z) else {
                continue;
            };
            regs += 1;
            if table.mark_in_flight(slot, T1_UNIT) {
                marks += 1;
                if !table.clear_in_flight(slot, T1_UNIT) {
                    lost = format!(" refused_clear_of_unit={T1_UNIT} after_regs={regs}");
                    continue;
                }
            }
            table.unregister(slot);
        }
        report(format!("DONE regs={regs} marks={marks}{lost}"));
        sleep_forever();
    }
    fn role_newcomer() {
        let path = path_arg("path");
        let stop = path_arg("stop");
        let table = HeartbeatTable::open(&path, 1).unwrap();
        report(format!("NEWCOMER tid={}", gettid()));
        let (mut regs, mut full) = (0u64, 0u64);
        let t0 = Instant::now();
        while !stop.exists() && t0.elapsed() < Duration::from_secs(60) {
            match table.register(me()) {
                Ok(slot) => {
                    regs += 1;
                    table.unregister(slot);
                }
                Err(_) => full += 1,
            }
        }
        report(format!("DONE regs={regs} full={full}"));
        sleep_forever();
    }
    cxc_testkit::play_role!(role_proxy, role_newcomer);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let stop = d.path().join("stop");
    let table = HeartbeatTable::create(&path, 1).unwrap();
    let spawn = |role: &str| {
        RoleCommand::new(T1, role)
            .arg("path", &path)
            .arg("stop", &stop)
            .spawn()
    };
    let mut proxy = spawn("proxy");
    let pline = proxy.next_report(REPORT_WAIT);
    let mut newcomer = spawn("newcomer");
    let nline = newcomer.next_report(REPORT_WAIT);
    let z = num(&pline, "z");
    let npid = u64::from(newcomer.pid());
    let w = Words(std::fs::File::open(&path).unwrap());
    let live = |g: u64| (g << 1) << 32;
    let Some(p) = Traced::seize(num(&pline, "tid") as u32) else {
        println!("SKIPPED: ptrace of a child is not allowed here ({T1})");
        return;
    };
    let n = Traced::seize(num(&nline, "tid") as u32).expect("ptrace the newcomer");
    let t0 = Instant::now();
    let mut staged = None;
    while staged.is_none() && t0.elapsed() < Duration::from_secs(20) {
        // A: P between the retags of its two halves (identity complete, low half live,
        // high half not yet), N wherever it is but holding nothing.
        let p_between = || {
            let o = w.owner();
            let g = gen_of_owner(o);
            o >> 32 == z
                && o & 1 == 0
                && w.id_gen() == g | (1 << 32)
                && w.lo() == live(g)
                && w.hi() >> 32 != g << 1
        };
        let mut pending = (0, 0);
        let mut found = false;
        for _ in 0..400_000 {
            let o = w.owner();
            if o >> 32 == npid {
                n.step(&mut pending.1);
            } else {
                p.step(&mut pending.0);
            }
            if p_between() {
                found = true;
                break;
            }
        }
        assert!(found, "harness: P never stood between its two retags");
        let owner = w.owner();
        let g = gen_of_owner(owner);
        // Pass 2 fences the dead registration before it closes the halves.
        let fenced = owner | 1;
        // B: a new epoch (so N's last_seen raise shows), then N until it has fenced P's
        // registration, closed the halves and raised last_seen, before its owner CAS.
        table.tick_global_epoch();
        let before = w.last_seen();
        let closed = n.step_until(400_000, || {
            (w.owner() != owner && w.owner() != fenced)
                || (w.owner() == fenced && w.last_seen() > before && w.lo() == live(g) | (1 << 32))
        });
        if !closed || w.owner() != fenced {
            println!("round spoiled (N's attempt began before the tick): again");
            continue;
        }
        // C: P retags its high half, returns and tries to mark unit 40: with its
        // registration fenced, no bit may land under it. P stops when a bit lands (the
        // break) or when the owner word moves on (P registered anew after its mark
        // failed).
        let moved = p.step_until(400_000, || w.hi() & 0xffff_ffff != 0 || w.owner() != fenced);
        let hi = w.hi();
        assert!(
            moved,
            "harness: P neither marked nor registered anew (hi={hi:#x} owner={:#x})",
            w.owner()
        );
        assert!(
            w.owner() != fenced || hi & 0xffff_ffff == 0,
            "unit {T1_UNIT} landed under the fenced registration: hi={hi:#x}"
        );
        // D: N's owner CAS (it fails if P registered anew meanwhile).
        if w.owner() == fenced {
            assert!(
                n.step_until(400_000, || w.owner() != fenced),
                "harness: N never made its owner CAS"
            );
        }
        staged = Some((owner, hi));
    }
    let (owner, hi) = staged.expect("harness: the interleaving was never staged");
    println!(
        "staged: owner={owner:#x} (P for zombie {z}), hi={hi:#x} with unit {T1_UNIT}; then N's \
         owner CAS: {:#x}",
        w.owner()
    );
    drop(p);
    drop(n);
    let lost_told = wait_until(Duration::from_secs(10), || {
        w.owner() != owner && w.lo() >> 32 == (gen_of_owner(w.owner()) << 1)
    });
    std::thread::sleep(Duration::from_millis(50));
    touch(&stop);
    let pdone = proxy.next_report(REPORT_WAIT);
    let ndone = newcomer.next_report(REPORT_WAIT);
    let (o2, lo2, hi2) = raw_slot(&path, 0);
    let orphan = orphan_bits(&path, 0);
    println!(
        "after: owner={o2:#x} lo={lo2:#x} hi={hi2:#x} (N's CAS seen: {lost_told}); P: {pdone}; N: {ndone}"
    );
    let snap = table.snapshot(0).unwrap();
    proxy.kill();
    newcomer.kill();
    let wd = FailoverWatchdog::with_grace(&table, 0).with_os_check_interval(Duration::ZERO);
    let mut reclaimed = 0u64;
    let mut reused = None;
    for _ in 0..20 {
        for (slot, _) in wd.scan().dead_slots {
            reclaimed |= wd.reclaim(slot);
        }
        table.tick_global_epoch();
        wd.sweep_idle();
        if let Ok(s) = table.register(me()) {
            reused = Some(s);
            break;
        }
    }
    println!("snapshot after: {snap:?}; reclaimed {reclaimed:#x}; reused {reused:?}");
    let refused = pdone.contains("refused_clear");
    assert_eq!(
        (
            orphan,
            refused && reclaimed & (1 << T1_UNIT) == 0,
            reused.is_some()
        ),
        (0, false, true),
        "(units in a half of an older generation than the owner word's, invisible to every \
         snapshot and scan; P refused its clear of unit {T1_UNIT} with no watchdog or sweep \
         running, and no watchdog ever found the unit; the one slot reusable once everyone \
         is gone (H4)). P: {pdone}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. A worker whose main thread exited before it first touched the library.
// ---------------------------------------------------------------------------------------

const T2: &str = "hb_worker_half_exited_before_its_first_call_is_alive_until_its_last_thread_ends";
const T2_UNIT: u8 = 6;

/// heartbeat.md: "A main thread that exited while other threads run leaves `Z` in
/// `/proc/<pid>/stat`; such a worker is alive"; "`register(pid)` looks up the identity of
/// the process `pid` names at that moment (its own for the caller's pid)"; "Register real
/// pids to get crash detection by OS identity (and slot reuse after a crash with no
/// bits)"; failover-watchdog.md: "a main thread that exited while other threads run is
/// *not* dead"; "A dead process is therefore detected within about two intervals or two
/// scans"; counters `OS_DEAD_DETECTED`, `REUSE_OS_DEAD`.
///
/// The existing half-exit tests register before the main thread exits. Here the worker's
/// main thread exits *first*, so its identity is computed for the first time in a
/// half-exited process (from its worker thread), then it registers twice (one slot with a
/// unit, one idle). The table is full. While it lives: never reported, never swept, its
/// idle slot never taken. When its last thread ends: reported by OS identity within two
/// scans, exactly its unit reclaimed, and both slots reused. Pidfs and fallback paths.
#[test]
fn hb_worker_half_exited_before_its_first_call_is_alive_until_its_last_thread_ends() {
    fn role_half() {
        assert!(exit_main_thread(), "the main thread did not exit");
        let path = path_arg("path");
        let table = HeartbeatTable::open(&path, 2).unwrap();
        let busy = table.register(me()).unwrap();
        assert!(table.mark_in_flight(busy, T2_UNIT));
        let idle = table.register(me()).unwrap();
        report(format!("SLOTS busy={busy} idle={idle}"));
        child_wait_for_path(&path_arg("end"), Duration::from_secs(30));
        // The last thread ends: the whole process is gone (no unregister).
        // SAFETY: ends this process at once.
        unsafe { libc::_exit(0) };
    }
    cxc_testkit::play_role!(role_half);
    let _s = serial();
    for fallback in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("hb");
        let end = d.path().join("end");
        let table = HeartbeatTable::create(&path, 2).unwrap();
        let mut cmd = RoleCommand::new(T2, "half")
            .arg("path", &path)
            .arg("end", &end);
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut kid = cmd.spawn();
        let line = kid.next_report(REPORT_WAIT);
        let (busy, idle) = (num(&line, "busy") as usize, num(&line, "idle") as usize);
        assert_eq!(kid.state(), Some('Z'), "the main thread exited");
        let snap = table.snapshot(busy).unwrap();
        let id = snap.identity;
        assert!(
            id.is_known() && id.pid == kid.pid() && id.is_fallback() == fallback,
            "fallback={fallback}: identity recorded in a half-exited process: {id:?}"
        );
        assert_eq!(
            liveness(&id),
            Liveness::Alive,
            "fallback={fallback}: {id:?}"
        );
        if !fallback {
            assert_eq!(
                Identity::of_pid(kid.pid()),
                Some(id),
                "the recorded identity is the process's"
            );
        }
        let w = FailoverWatchdog::with_grace(&table, BIG).with_os_check_interval(Duration::ZERO);
        for i in 0..40 {
            let r = w.scan();
            assert!(
                r.dead_slots.is_empty(),
                "fallback={fallback}, scan {i}: the half-exited worker was reported dead: {:?}",
                r.dead_slots
            );
            assert_eq!(
                w.sweep_idle(),
                0,
                "fallback={fallback}: its idle slot was swept"
            );
            assert!(
                table.register(me()).is_err(),
                "fallback={fallback}: the live half-exited worker's idle slot was taken"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        let before = table.stats();
        touch(&end);
        assert!(
            kid.wait_timeout(Duration::from_secs(10)).is_some(),
            "the worker did not end"
        );
        let dead: Vec<usize> = (0..3)
            .flat_map(|_| w.scan().dead_slots)
            .map(|(s, _)| s)
            .collect();
        assert!(
            dead.contains(&busy),
            "fallback={fallback}: the gone worker was not reported within 3 scans: {dead:?}"
        );
        assert_eq!(w.reclaim(busy), 1 << T2_UNIT, "fallback={fallback}");
        assert_eq!(w.reclaim(busy), 0, "fallback={fallback}: reclaimed twice");
        let mut got = [table.register(me()).ok(), table.register(me()).ok()];
        got.sort();
        let mut want = [Some(busy), Some(idle)];
        want.sort();
        assert_eq!(got, want, "fallback={fallback}: both slots reused");
        let after = table.stats();
        assert_eq!(
            (
                after.os_dead_detected - before.os_dead_detected >= 1,
                after.reuse_os_dead - before.reuse_os_dead
            ),
            (true, 1),
            "fallback={fallback}: counters {before:?} -> {after:?}"
        );
        println!("fallback={fallback}: ok, {:?} -> {:?}", before, after);
    }
}

// ---------------------------------------------------------------------------------------
// 3. Slots unregistered with units left, raced by three watchdog processes.
// ---------------------------------------------------------------------------------------

const T3: &str =
    "hb_units_left_by_unregister_are_reported_at_once_and_reclaimed_once_by_racing_watchdogs";
const T3_CAP: usize = 64;
const T3_ROUNDS: u64 = 12;
const T3_WATCHDOGS: usize = 3;

/// heartbeat.md, Unregister: "Bits left behind stay in the FENCED slot, which the next
/// scan reports at once (whatever its lag), so abandoned units are reassigned rather than
/// lost"; failover-watchdog.md: "any number of watchdogs, in any processes; `reclaim`
/// returns each bit exactly once"; reclaim step 1: "If `S` was already a fenced word (a
/// re-reported fenced slot), the owner must still equal `S`"; "`register` reuses
/// fenced/reclaimed slots".
///
/// A re-reported fenced slot passes every racing watchdog's fence step (none of them
/// fences it: it already is), so only the halves' CAS keep the take exactly-once. Each
/// round: this process fills 64 slots, marks random units in both halves and unregisters
/// all (units left). A watchdog here with an infinite grace and no OS check must report
/// all 64 at once. Then three watchdog processes (infinite grace, no OS check) scan and
/// reclaim at the same instant. Every unit must come back exactly once, and all 64 slots
/// must be registrable again.
#[test]
fn hb_units_left_by_unregister_are_reported_at_once_and_reclaimed_once_by_racing_watchdogs() {
    fn role_reclaimer() {
        let d = path_arg("dir");
        let table = HeartbeatTable::open(d.join("hb"), T3_CAP).unwrap();
        let w = FailoverWatchdog::with_grace(&table, BIG).with_os_check_interval(Duration::MAX);
        for r in 0..T3_ROUNDS {
            let go = d.join(format!("go{r}"));
            child_wait_for_path(&go, Duration::from_secs(30));
            let start: u64 = std::fs::read_to_string(&go)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            while cxc_testkit::mono_ns() < start {
                std::hint::spin_loop();
            }
            let mut got = Vec::new();
            for (slot, _) in w.scan().dead_slots {
                let bits = w.reclaim(slot);
                if bits != 0 {
                    got.push(format!("{slot}:{bits}"));
                }
            }
            report(format!("R r={r} got={}", got.join(",")));
        }
    }
    cxc_testkit::play_role!(role_reclaimer);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let table = HeartbeatTable::create(d.path().join("hb"), T3_CAP).unwrap();
    let mut kids: Vec<Proc> = (0..T3_WATCHDOGS)
        .map(|_| {
            RoleCommand::new(T3, "reclaimer")
                .arg("dir", d.path())
                .spawn()
        })
        .collect();
    let mut rng = Rng::for_test();
    let here = FailoverWatchdog::with_grace(&table, BIG).with_os_check_interval(Duration::MAX);
    let (mut units, mut split) = (0u64, 0u64);
    for r in 0..T3_ROUNDS {
        let mut marked = vec![0u64; T3_CAP];
        for (i, m) in marked.iter_mut().enumerate() {
            let slot = table
                .register(me())
                .unwrap_or_else(|e| panic!("round {r}: registration {i} refused: {e:?} (H4)"));
            let bits = rng.next_u64() | 1 | (1 << 63);
            for b in FailoverWatchdog::iter_in_flight_bits(bits) {
                assert!(table.mark_in_flight(slot, b));
            }
            *m = bits;
            let _ = slot;
        }
        // Slot order = registration order in a free table.
        for slot in 0..T3_CAP {
            assert!(table.unregister(slot), "round {r}: unregister {slot}");
        }
        let seen = here.scan();
        let reported: Vec<(usize, u64)> = seen
            .dead_slots
            .iter()
            .map(|(i, s)| (*i, s.in_flight_bitmap))
            .collect();
        let want: Vec<(usize, u64)> = marked.iter().copied().enumerate().collect();
        assert_eq!(
            reported, want,
            "round {r}: units left by unregister must be reported at once (grace infinite)"
        );
        let go = d.path().join(format!("go{r}"));
        let tmp = d.path().join("go.tmp");
        std::fs::write(&tmp, format!("{}", cxc_testkit::mono_ns() + 20_000_000)).unwrap();
        std::fs::rename(&tmp, &go).unwrap();
        let mut got = vec![0u64; T3_CAP];
        let mut takers = vec![0u32; T3_CAP];
        for k in kids.iter_mut() {
            let line = k.next_report(REPORT_WAIT);
            let list = line.split("got=").nth(1).unwrap_or("");
            for item in list.split(',').filter(|s| !s.is_empty()) {
                let (slot, bits) = item.split_once(':').unwrap();
                let (slot, bits): (usize, u64) = (slot.parse().unwrap(), bits.parse().unwrap());
                assert_eq!(
                    got[slot] & bits,
                    0,
                    "round {r}: slot {slot}: units {:#x} returned twice",
                    got[slot] & bits
                );
                got[slot] |= bits;
                takers[slot] += 1;
            }
        }
        assert_eq!(got, marked, "round {r}: every unit returned (exactly once)");
        units += marked
            .iter()
            .map(|m| u64::from(m.count_ones()))
            .sum::<u64>();
        split += takers.iter().filter(|&&t| t > 1).count() as u64;
    }
    for k in kids.iter_mut() {
        k.finish(REPORT_WAIT);
    }
    let stats = table.stats();
    println!(
        "{T3_ROUNDS} rounds, {units} units each returned once; {split} slots taken half by one \
         watchdog, half by another; stats {stats:?}"
    );
    assert_eq!(
        stats.reclaimed_bits, units,
        "RECLAIMED_BITS counts each unit once"
    );
    assert_eq!(
        stats.fence, 0,
        "no watchdog fenced a slot unregister had fenced"
    );
}

// ---------------------------------------------------------------------------------------
// 4. Consistent snapshots across processes (H1).
// ---------------------------------------------------------------------------------------

const T4: &str = "hb_snapshots_from_another_process_pair_bits_with_their_own_identity_and_epoch";
const T4_CAP: usize = 3;
const T4_CHURNERS: u64 = 4;

/// heartbeat.md, Snapshot (H1): "every field belongs to the one registration named by the
/// (unchanged) owner word; ... a snapshot showing bits of a registration also shows that
/// registration's identity and a `last_seen` at least its registration epoch"; layout:
/// "`last_seen`: epoch of the last beat; monotone within a registration"; Register step 3:
/// "no snapshot pairs the new owner with an ancient `last_seen`".
///
/// Four processes churn through 3 slots: each reads the epoch e0, registers itself, marks
/// its signature unit (32 + k) and then the units of e0's binary digits (low half: any
/// subset of them is a number <= e0 <= its registration epoch), beats, clears and
/// unregisters. This process ticks the epoch and snapshots every slot in a loop, SIGSTOPping
/// churners at random moments (registrations stall mid-way). Every snapshot with units must
/// show the identity of the process its pid names, that process's signature only, low
/// units <= `last_seen`, and `last_seen` never goes back for one (pid, generation).
#[test]
fn hb_snapshots_from_another_process_pair_bits_with_their_own_identity_and_epoch() {
    fn role_churner() {
        let k: u8 = cxc_testkit::arg("k").parse().unwrap();
        let stop = path_arg("stop");
        let table = HeartbeatTable::open(path_arg("path"), T4_CAP).unwrap();
        let mut rng = Rng::for_test();
        report(format!("UP k={k}"));
        let mut n = 0u64;
        while !stop.exists() {
            let e0 = table.global_epoch();
            let Ok(slot) = table.register(me()) else {
                continue;
            };
            n += 1;
            assert!(table.mark_in_flight(slot, 32 + k));
            let low = (e0 & 0x7fff_ffff) as u32;
            for b in FailoverWatchdog::iter_in_flight_bits(u64::from(low)) {
                assert!(table.mark_in_flight(slot, b));
            }
            if rng.percent(50) {
                assert!(table.beat(slot));
            }
            for b in FailoverWatchdog::iter_in_flight_bits(u64::from(low)) {
                assert!(table.clear_in_flight(slot, b));
            }
            assert!(table.clear_in_flight(slot, 32 + k));
            assert!(table.unregister(slot));
        }
        report(format!("DONE registrations={n}"));
    }
    cxc_testkit::play_role!(role_churner);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hb");
    let stop = d.path().join("stop");
    let table = HeartbeatTable::create(&path, T4_CAP).unwrap();
    // Start past epoch 0 so e0 has digits.
    for _ in 0..1000 {
        table.tick_global_epoch();
    }
    let mut kids: Vec<Proc> = (0..T4_CHURNERS)
        .map(|k| {
            RoleCommand::new(T4, "churner")
                .arg("k", k.to_string())
                .arg("path", &path)
                .arg("stop", &stop)
                .spawn()
        })
        .collect();
    let mut ids = std::collections::HashMap::new();
    for (k, kid) in kids.iter_mut().enumerate() {
        kid.next_report(REPORT_WAIT);
        ids.insert(
            kid.pid(),
            (
                k as u64,
                Identity::of_pid(kid.pid()).expect("a live churner"),
            ),
        );
    }
    let mut rng = Rng::for_test();
    let mut last: Vec<(u32, u64, u64)> = vec![(0, 0, 0); T4_CAP];
    let (mut with_bits, mut total, mut stops) = (0u64, 0u64, 0u64);
    let t0 = Instant::now();
    let mut stopped: Option<u32> = None;
    while t0.elapsed() < Duration::from_secs(4) {
        if total % 64 == 0 {
            table.tick_global_epoch();
        }
        if total % 512 == 0 {
            if let Some(p) = stopped.take() {
                signal(p, libc::SIGCONT);
            } else if rng.percent(50) {
                let p = kids[rng.below(T4_CHURNERS) as usize].pid();
                signal(p, libc::SIGSTOP);
                stopped = Some(p);
                stops += 1;
            }
        }
        for (slot, prev) in last.iter_mut().enumerate() {
            let Some(s) = table.snapshot(slot) else {
                continue;
            };
            total += 1;
            if s.pid == 0 {
                continue;
            }
            let (k, id) = *ids
                .get(&s.pid)
                .unwrap_or_else(|| panic!("slot {slot}: a pid nobody registered: {s:?}"));
            if s.identity.is_known() || s.in_flight_bitmap != 0 {
                assert_eq!(
                    s.identity, id,
                    "slot {slot}: a snapshot pairs pid {} with another identity: {s:?}",
                    s.pid
                );
            }
            if s.in_flight_bitmap != 0 {
                with_bits += 1;
                let hi = s.in_flight_bitmap >> 32;
                let lo = s.in_flight_bitmap & 0xffff_ffff;
                assert_eq!(
                    hi & !(1 << k),
                    0,
                    "slot {slot}: units of another registration under pid {}: {s:?}",
                    s.pid
                );
                assert!(
                    lo <= s.last_seen_epoch,
                    "slot {slot}: units marked at epoch >= {lo} with last_seen {} (older than \
                     the registration): {s:?}",
                    s.last_seen_epoch
                );
            }
            if (prev.0, prev.1) == (s.pid, s.generation) {
                assert!(
                    s.last_seen_epoch >= prev.2,
                    "slot {slot}: last_seen went back within registration ({}, {}): {} -> {}",
                    s.pid,
                    s.generation,
                    prev.2,
                    s.last_seen_epoch
                );
            }
            *prev = (s.pid, s.generation, s.last_seen_epoch);
        }
    }
    if let Some(p) = stopped {
        signal(p, libc::SIGCONT);
    }
    touch(&stop);
    let mut regs = 0;
    for k in kids.iter_mut() {
        let lines = k.finish(REPORT_WAIT);
        regs += num(lines.last().unwrap(), "registrations");
    }
    let giveups = table.stats().snapshot_giveup;
    println!(
        "{total} snapshots, {with_bits} with units, {regs} registrations, {stops} SIGSTOPs, \
         {giveups} snapshot give-ups"
    );
    assert!(with_bits > 1000 && regs > 1000, "too little churn to judge");
}

// ---------------------------------------------------------------------------------------
// 5. Sibling pid namespaces: two processes that are both pid 1.
// ---------------------------------------------------------------------------------------

const T5: &str = "hb_pid1_of_a_sibling_namespace_neither_acts_for_nor_judges_the_other_pid1s_slot";
const T5_UNIT: u8 = 3;

fn t5_calls(table: &HeartbeatTable, slot: usize) -> String {
    let beat = table.beat(slot);
    let mark = table.mark_in_flight(slot, 7);
    let clear = table.clear_in_flight(slot, T5_UNIT);
    let unregister = table.unregister(slot);
    let w = FailoverWatchdog::with_grace(table, BIG).with_os_check_interval(Duration::ZERO);
    let mut dead = 0;
    for _ in 0..5 {
        dead += w.scan().dead_slots.len();
        std::thread::sleep(Duration::from_millis(10));
    }
    format!(
        "beat={beat} mark={mark} clear={clear} unregister={unregister} dead={dead} swept={}",
        w.sweep_idle()
    )
}

/// heartbeat.md, Pid namespaces: "a slot's identity names its pid namespace. A process in
/// another namespace gets `Liveness::Unknown` for it ...: such slots are never declared
/// dead or adopted by OS identity from the other namespace, and only heartbeat staleness
/// (grace) reclaims them there"; Register: "A handle that did not register a slot acts for
/// it only when the slot is a live registration whose recorded identity is this very
/// process's (same pid, pid namespace, ...)".
///
/// The existing namespace test has a live worker and a child namespace. Here A and B are
/// both pid 1, of two sibling namespaces (the same pid number names two processes). A
/// registers itself with a unit. B (same pid!) cannot beat, mark, clear or unregister A's
/// slot, and its watchdog and sweep leave it alone, while A lives and after A died; B's
/// register never reuses A's slot, not even once A is dead (the table is full). A
/// watchdog of the root namespace does not judge A dead either; staleness then reclaims
/// exactly A's unit.
#[test]
fn hb_pid1_of_a_sibling_namespace_neither_acts_for_nor_judges_the_other_pid1s_slot() {
    match role().as_deref() {
        Some("nsroot") => procs::nsroot(T5),
        Some("scenario") => {
            die_with_parent();
            procs::mount_own_proc();
            let d = procs::dir();
            let table = HeartbeatTable::open(d.join("hb"), 2).unwrap();
            if cxc_testkit::arg("which") == "a" {
                let slot = table.register(me()).unwrap();
                assert!(table.mark_in_flight(slot, T5_UNIT));
                report(format!("A pid={} slot={slot}", me()));
                child_wait_for_path(&d.join("a_die"), Duration::from_secs(30));
                // SAFETY: ends this process (pid 1 of its namespace) at once.
                unsafe { libc::_exit(0) };
            }
            report(format!("B pid={}", me()));
            child_wait_for_path(&d.join("b_go1"), Duration::from_secs(30));
            let slot: usize = std::fs::read_to_string(d.join("b_go1"))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let own = table.register(me()).map_or(99, |s| s as u64);
            let second = table.register(me()).is_ok();
            report(format!(
                "B phase=1 {} own={own} second={second}",
                t5_calls(&table, slot)
            ));
            child_wait_for_path(&d.join("b_go2"), Duration::from_secs(30));
            let again = table.register(me()).is_ok();
            report(format!(
                "B phase=2 {} register={again}",
                t5_calls(&table, slot)
            ));
            procs::park();
        }
        Some(other) => panic!("unknown role {other}"),
        None => {
            if procs::skip_unless_root(T5) {
                return;
            }
            let _s = serial();
            let d = tempfile::tempdir().unwrap();
            let table = HeartbeatTable::create(d.path().join("hb"), 2).unwrap();
            let ns = |which: &str| {
                RoleCommand::new(T5, "nsroot")
                    .arg("dir", d.path())
                    .arg("which", which)
                    .spawn()
            };
            let mut a = ns("a");
            let aline = procs::wait_line(&mut a, "A");
            let mut b = ns("b");
            let bline = procs::wait_line(&mut b, "B");
            assert_eq!((num(&aline, "pid"), num(&bline, "pid")), (1, 1), "harness");
            let slot = num(&aline, "slot") as usize;
            let snap = table.snapshot(slot).unwrap();
            assert!(
                snap.identity.is_known() && snap.identity.pid == 1,
                "{snap:?}"
            );
            assert_eq!(liveness(&snap.identity), Liveness::Unknown, "{snap:?}");
            // Published whole (B reads it as soon as it exists).
            let tmp = d.path().join("b_go1.tmp");
            std::fs::write(&tmp, slot.to_string()).unwrap();
            std::fs::rename(&tmp, d.path().join("b_go1")).unwrap();
            let p1 = procs::wait_line(&mut b, "B phase=1");
            println!("{p1}");
            let here =
                FailoverWatchdog::with_grace(&table, BIG).with_os_check_interval(Duration::ZERO);
            let mut dead_here = 0;
            touch(&d.path().join("a_die"));
            assert!(
                a.wait_timeout(Duration::from_secs(10)).is_some(),
                "A did not end"
            );
            for _ in 0..5 {
                dead_here += here.scan().dead_slots.len();
                std::thread::sleep(Duration::from_millis(10));
            }
            touch(&d.path().join("b_go2"));
            let p2 = procs::wait_line(&mut b, "B phase=2");
            println!("{p2}; root-namespace watchdog reports: {dead_here}");
            for (phase, line) in [(1, &p1), (2, &p2)] {
                assert_eq!(
                    (
                        flag(line, "beat"),
                        flag(line, "mark"),
                        flag(line, "clear"),
                        flag(line, "unregister"),
                        num(line, "dead"),
                        num(line, "swept")
                    ),
                    (false, false, false, false, 0, 0),
                    "phase {phase} (A {}): pid 1 of a sibling namespace acted for or judged \
                     A's slot: {line}",
                    if phase == 1 { "alive" } else { "dead" }
                );
            }
            assert_ne!(num(&p1, "own"), slot as u64, "B took A's slot: {p1}");
            assert!(
                !flag(&p1, "second") && !flag(&p2, "register"),
                "A's slot reused from B's namespace"
            );
            assert_eq!(
                dead_here, 0,
                "the root namespace judged A's slot by OS identity"
            );
            let snap2 = table.snapshot(slot).unwrap();
            assert_eq!(
                (snap2.in_flight_bitmap, snap2.fenced, snap2.identity),
                (1 << T5_UNIT, false, snap.identity),
                "A's slot changed: {snap2:?}"
            );
            // Staleness alone reclaims it.
            let stale =
                FailoverWatchdog::with_grace(&table, 2).with_os_check_interval(Duration::MAX);
            let mut got = 0;
            for _ in 0..4 {
                for (s, _) in stale.scan().dead_slots {
                    got |= stale.reclaim(s);
                }
            }
            assert_eq!(got, 1 << T5_UNIT, "staleness reclaims exactly A's unit");
        }
    }
}
