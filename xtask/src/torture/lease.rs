//! Lease torture: workers claim an `OwnerLease<[u64; 6]>`, read-modify-write a
//! checksummed payload, and log every accepted write; the supervisor kills and pauses
//! them (preferring the current holder) and merges the logs at the end.
//!
//! Payload: `[seq, writer_gen, writer_pid, prev_gen, salt, checksum]`. An accepted write
//! by claim `g` read payload `P` and published `[P.seq + 1, g, pid, P.writer_gen, ..]`.
//!
//! Checks (see docs/RELIABILITY.md):
//! - torn read: every payload read (owner reads, `with_lease`, `status()`) has a valid
//!   checksum (L4);
//! - exclusion/fencing, live: a holder stores its generation into `max_entered`
//!   (`fetch_max`) right after its claim; a write by claim `g` that was accepted although
//!   `max_entered > g` or the lease's generation `> g` was observed *before* the write
//!   started means a superseded holder published (L1/L2). A claim that is still
//!   current although a newer claim already entered is a violation too;
//! - stale claims (L3): after losing a claim, a worker claims again and uses the old
//!   claim: its write, beat and release must all be refused;
//! - merged logs: each `seq` is accepted at most once (two holders or a lost update),
//!   generations never decrease along `seq`, consecutive entries chain
//!   (`prev_gen(s) == gen(s-1)`), and the final payload agrees with the logs;
//! - progress (L5): a holder that the OS shows dead is replaced within seconds, and the
//!   supervisor can claim the lease after all workers exit;
//! - dead means dead: `claim_dead_owner` + `claim_exiting` (takeovers of holders judged
//!   dead, or exiting by their sentinel) never exceeds the number of lease processes that
//!   really died (SIGKILLs, crashes). Some worker
//!   processes are half-exited (their main thread exited, `/proc/PID/stat` says `Z`, a
//!   worker thread keeps claiming); a lease that took such a live holder for dead would
//!   count takeovers no death accounts for;
//! - sibling threads: in some processes 3-4 threads claim under their own pid numbers
//!   and release each other's claims by pid (`release(pid)`, allowed within a process),
//!   preferably in the middle of a write. A write or `with_lease` of a claim that a
//!   sibling released before it started must fail.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc::lease::counter;
use cxc::{EpochMode, LeaseClaim, LeaseOptions, OwnerLease, Preemption};
use cxc_mmf::identity::{ProcStatus, proc_group_alive, proc_status};

use super::control::{Ctx, Stat};
use super::opts::{Role, WorkerOptions};
use super::shm::Words;
use cxc_testkit::Rng;

pub(crate) const FILE: &str = "lease.cxc";
const AUX_FILE: &str = "lease-aux.cxc";
const AUX_TAG: u64 = 0x4c45_4153; // "LEAS"
const LOG_DIR: &str = "lease-log";
/// Aux head word: the highest claim generation that entered its critical section.
const MAX_ENTERED: usize = 0;

/// Epoch tick and grace: a holder that has not beaten for 10 ticks (50 ms) is stale.
pub(crate) const TICK: Duration = Duration::from_millis(5);
pub(crate) const GRACE: u64 = 10;
/// A gap longer than this between two steps of a holder means it was stopped (or starved)
/// for longer than the grace window.
const RESUMED_GAP: Duration = Duration::from_millis(80);
/// A dead holder that is still the holder after this long is an L5 violation.
const DEAD_HOLDER_LIMIT: Duration = Duration::from_secs(3);

/// Pid numbers of sibling threads: `SIBLING_BIT | pid << 3 | k`. Real pids are below
/// 2^22 (the kernel's `pid_max` limit), so these never name a real process and map back to
/// their process unambiguously.
const SIBLING_BIT: u32 = 1 << 30;

/// The pid number sibling thread `k` of process `pid` claims under.
fn sibling_pid(pid: u32, k: usize) -> u32 {
    debug_assert!(pid < 1 << 27 && k < 8);
    SIBLING_BIT | pid << 3 | k as u32
}

/// The process that claims under pid number `pid` (itself, or a sibling thread's process).
pub(crate) fn process_of(pid: u32) -> u32 {
    if pid & SIBLING_BIT != 0 {
        (pid & !SIBLING_BIT) >> 3
    } else {
        pid
    }
}

type Payload = [u64; 6];
const LOG_RECORD: usize = 32;

fn checksum(p: &Payload) -> u64 {
    let mut h = 0x6a09_e667_f3bc_c908u64;
    for w in &p[..5] {
        h = cxc_testkit::mix(h ^ w);
    }
    h
}

fn payload(seq: u64, generation: u64, pid: u32, prev_gen: u64, salt: u64) -> Payload {
    let mut p = [seq, generation, u64::from(pid), prev_gen, salt, 0];
    p[5] = checksum(&p);
    p
}

fn valid(p: &Payload) -> bool {
    p[5] == checksum(p)
}

/// Creates the lease and the checker files (supervisor, before any worker starts).
pub(crate) fn setup(dir: &Path) -> Result<(), String> {
    let opts = LeaseOptions {
        preemption: Preemption::LowerPid,
        epoch: EpochMode::Clock { tick: TICK },
        ..LeaseOptions::default()
    };
    OwnerLease::create_with(dir.join(FILE), payload(0, 0, 0, 0, 0), &opts)
        .map_err(|e| format!("create lease: {e}"))?;
    Words::create(&dir.join(AUX_FILE), AUX_TAG, 0)?;
    std::fs::create_dir_all(dir.join(LOG_DIR)).map_err(|e| format!("create log dir: {e}"))?;
    Ok(())
}

fn open_lease(dir: &Path) -> Result<OwnerLease<Payload>, String> {
    OwnerLease::open(dir.join(FILE)).map_err(|e| format!("open lease: {e}"))
}

/// Opens the lease and exits, as a `cxc inspect` run or a process that never claims would
/// (`--ident-churn`). Such processes once took entries of the identity table; now a slot
/// is taken only by a claim, so they take none.
pub(crate) fn open_only(dir: &Path) -> Result<(), String> {
    open_lease(dir).map(drop)
}

struct Worker<'a> {
    ctx: &'a Ctx,
    lease: &'a OwnerLease<Payload>,
    aux: Words,
    log: File,
    rng: Rng,
    me: u32,
    sib: Option<Siblings<'a>>,
}

/// What a sibling thread knows of its siblings.
struct Siblings<'a> {
    /// This thread's index.
    k: usize,
    /// Every sibling's pid number (this thread's too).
    pids: &'a [u32],
    /// Per sibling: the highest generation a sibling saw that sibling's current claim at,
    /// right before a `release(pid)` of it succeeded (`fetch_max`, after the release). A
    /// claim whose generation is at most this is no longer current.
    released: &'a [AtomicU64],
}

fn open_log(dir: &Path, name: &str) -> Result<File, String> {
    let path = dir.join(LOG_DIR).join(format!("{name}.bin"));
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| format!("open {}: {e}", path.display()))
}

/// A lease worker process in its mode (the caller has already made it half-exited if the
/// mode says so).
pub(crate) fn process(ctx: &Ctx, o: &WorkerOptions) -> Result<(), String> {
    let rng = Rng::derive(o.seed, Role::Lease.code(), o.id as u64, o.inc);
    if o.lease_mode.siblings() {
        siblings(ctx, o, rng)
    } else {
        worker(ctx, rng)
    }
}

/// A worker: random claims, owner writes, `with_lease` updates and status reads until the
/// supervisor sets STOP.
fn worker(ctx: &Ctx, rng: Rng) -> Result<(), String> {
    let me = std::process::id();
    let lease = open_lease(&ctx.dir)?;
    let mut w = Worker {
        ctx,
        lease: &lease,
        aux: Words::open(&ctx.dir.join(AUX_FILE), AUX_TAG)?,
        log: open_log(&ctx.dir, &me.to_string())?,
        rng,
        me,
        sib: None,
    };
    w.run();
    Ok(())
}

/// 3-4 sibling threads sharing one lease handle, each claiming under its own pid number
/// (never sharing a claim: two threads read-modify-writing under one claim would lose
/// updates by design, not by a lease bug).
fn siblings(ctx: &Ctx, o: &WorkerOptions, mut rng: Rng) -> Result<(), String> {
    let pid = std::process::id();
    let n = rng.range(3, 5) as usize;
    let pids: Vec<u32> = (0..n).map(|k| sibling_pid(pid, k)).collect();
    let released: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let lease = open_lease(&ctx.dir)?;
    let (dir, who) = (&ctx.dir, ctx.who());
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..n)
            .map(|k| {
                let (lease, pids, released) = (&lease, &pids, &released);
                scope.spawn(move || -> Result<(), String> {
                    // Each thread reports through its own handle on the control file.
                    let ctx = Ctx::open(dir, format!("{who} thread {k}"))?;
                    let mut w = Worker {
                        ctx: &ctx,
                        lease,
                        aux: Words::open(&ctx.dir.join(AUX_FILE), AUX_TAG)?,
                        log: open_log(&ctx.dir, &format!("{pid}-{k}"))?,
                        rng: Rng::derive(
                            o.seed,
                            Role::Lease.code() + 16 * (k as u64 + 1),
                            o.id as u64,
                            o.inc,
                        ),
                        me: pids[k],
                        sib: Some(Siblings { k, pids, released }),
                    };
                    w.run();
                    Ok(())
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a sibling thread panicked".into()))
            })
            .collect::<Result<Vec<()>, String>>()
    })?;
    Ok(())
}

impl Worker<'_> {
    fn run(&mut self) {
        while !self.ctx.stopping() {
            self.ctx.bump(Stat::LeaseOps, 1);
            match self.rng.below(100) {
                0..60 => self.session(),
                60..85 => self.with_lease(),
                85..93 if self.sib.is_some() => self.release_sibling(),
                _ => self.observe(),
            }
            if self.rng.percent(50) {
                std::thread::sleep(Duration::from_micros(self.rng.below(300)));
            }
        }
    }

    /// The highest generation of this thread's pid that a sibling released (0 if none).
    fn released_by_sibling(&self) -> u64 {
        self.sib
            .as_ref()
            .map_or(0, |s| s.released[s.k].load(Ordering::SeqCst))
    }

    /// Sibling threads: release a sibling's claim by its pid (allowed within a process),
    /// preferably while the sibling is in the middle of a write or a `with_lease` closure.
    fn release_sibling(&mut self) {
        let Some(sib) = &self.sib else { return };
        let n = sib.pids.len();
        let j = (sib.k + 1 + self.rng.below(n as u64 - 1) as usize) % n;
        let target = sib.pids[j];
        let want_writing = self.rng.percent(70);
        let until = Instant::now() + Duration::from_micros(self.rng.range(100, 5_000));
        loop {
            let writing = self.lease.status().writing;
            // (pid, generation) from one load of the claim word.
            let cur = self.lease.current_claim().filter(|c| c.pid() == target);
            if let Some(c) = cur.filter(|_| writing || !want_writing) {
                if self.lease.release(target) {
                    // The released claim is `c` or a later claim of `target`: either way
                    // no claim of `target` up to `c.generation()` is current any more.
                    sib.released[j].fetch_max(c.generation(), Ordering::SeqCst);
                    self.ctx.bump(Stat::LeaseSibReleases, 1);
                    if writing {
                        self.ctx.bump(Stat::LeaseSibReleasesWriting, 1);
                    }
                }
                return;
            }
            if Instant::now() >= until {
                return;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    /// Time spent inside the critical section between two steps.
    fn think(&mut self) {
        let us = match self.rng.below(100) {
            0..70 => self.rng.below(200),
            70..95 => self.rng.range(200, 2_000),
            _ => self.rng.range(2_000, 20_000),
        };
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
    }

    /// Entering the critical section with claim `g`.
    fn enter(&self, g: u64, claim: Option<&LeaseClaim>) {
        let before = self.aux.head(MAX_ENTERED).fetch_max(g, Ordering::SeqCst);
        if before > g {
            self.ctx.bump(Stat::LeaseStaleEntry, 1);
            if claim.is_some_and(|c| self.lease.is_current(c)) {
                self.ctx.violate(
                    "L1 exclusion",
                    format_args!("claim {g} is still current although claim {before} entered"),
                );
            }
        }
    }

    fn log(&mut self, seq: u64, g: u64, prev_gen: u64) {
        let mut rec = [0u8; LOG_RECORD];
        for (i, v) in [seq, g, prev_gen, u64::from(self.me)]
            .into_iter()
            .enumerate()
        {
            rec[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        // One write of 32 bytes (O_APPEND): a kill leaves a whole record or none.
        if let Err(e) = self.log.write_all(&rec) {
            panic!("lease log write failed: {e}");
        }
    }

    /// Checks made after an accepted write: what was observed *before* the write started
    /// must not show a newer claim.
    fn check_accepted(&self, g: u64, entered: u64, term: u64, released: u64, how: &str) {
        if g != 0 && released >= g {
            self.ctx.violate(
                "L2 fencing",
                format_args!(
                    "{how} by claim {g} accepted although a sibling thread had released claim {released} of pid {:#x} before it started",
                    self.me
                ),
            );
        }
        if entered > g {
            self.ctx.violate(
                "L1/L2 fencing",
                format_args!(
                    "{how} by claim {g} accepted although claim {entered} had already entered"
                ),
            );
        }
        if term > g {
            self.ctx.violate(
                "L2 fencing",
                format_args!(
                    "{how} by claim {g} accepted although the lease generation was already {term}"
                ),
            );
        }
    }

    fn fenced(&self, resumed: bool) {
        self.ctx.bump(Stat::LeaseFenced, 1);
        if resumed {
            self.ctx.bump(Stat::LeaseResumedFenced, 1);
        }
    }

    /// Claim, one to five owner writes, release.
    fn session(&mut self) {
        let claim = if self.rng.percent(50) {
            self.lease.try_claim(self.me, GRACE)
        } else {
            let t = Duration::from_micros(self.rng.range(100, 20_000));
            self.lease.acquire(self.me, GRACE, t)
        };
        let Some(c) = claim else {
            self.ctx.bump(Stat::LeaseClaimFail, 1);
            return;
        };
        self.ctx.bump(Stat::LeaseClaims, 1);
        if c.payload_may_be_inconsistent() {
            self.ctx.bump(Stat::LeaseTornClaims, 1);
        }
        let g = c.generation();
        self.enter(g, Some(&c));
        let mut last = Instant::now();
        let mut lost = false;
        for _ in 0..self.rng.range(1, 6) {
            if self.rng.percent(50) {
                self.think();
            }
            let Some(p) = self.lease.read_claimed(&c) else {
                self.fenced(last.elapsed() > RESUMED_GAP);
                lost = true;
                break;
            };
            if !valid(&p) {
                self.ctx.violate(
                    "L4 torn read",
                    format_args!("read_claimed by claim {g} returned {p:x?}"),
                );
            }
            // Read-modify-write: the claim may be lost while we "compute".
            self.think();
            let resumed = last.elapsed() > RESUMED_GAP;
            if resumed {
                self.ctx.bump(Stat::LeaseResumed, 1);
            }
            if self.rng.percent(30) && !self.lease.beat_claimed(&c) {
                self.fenced(resumed);
                lost = true;
                break;
            }
            let entered = self.aux.head(MAX_ENTERED).load(Ordering::SeqCst);
            let term = self.lease.lease_term();
            let released = self.released_by_sibling();
            let next = payload(p[0] + 1, g, self.me, p[1], self.rng.next_u64());
            if !self.lease.write_claimed(&c, next) {
                self.fenced(resumed);
                lost = true;
                break;
            }
            self.ctx.bump(Stat::LeaseWrites, 1);
            self.log(p[0] + 1, g, p[1]);
            self.check_accepted(g, entered, term, released, "write_claimed");
            last = Instant::now();
        }
        if lost && self.rng.percent(50) {
            self.stale_after_reclaim(&c);
        } else {
            let _ = self.lease.release_claim(&c);
        }
    }

    /// Seed 003's A→B→A: after losing `old`, claim again, then use the old claim. Every
    /// operation with it must be refused and must leave the new claim alone (L3).
    fn stale_after_reclaim(&mut self, old: &LeaseClaim) {
        let Some(c) = self.lease.try_claim(self.me, GRACE) else {
            let _ = self.lease.release_claim(old);
            return;
        };
        let g = c.generation();
        if g == old.generation() {
            // Not lost after all (a read gave up under interference): plain release.
            let _ = self.lease.release_claim(&c);
            return;
        }
        self.ctx.bump(Stat::LeaseClaims, 1);
        self.ctx.bump(Stat::LeaseStaleProbes, 1);
        self.enter(g, Some(&c));
        let og = old.generation();
        if self.lease.write_claimed(old, payload(0, og, self.me, 0, 0)) {
            self.ctx.violate(
                "L3 stale claims",
                format_args!("write with superseded claim {og} accepted while claim {g} holds"),
            );
        }
        if self.lease.beat_claimed(old) {
            self.ctx.violate(
                "L3 stale claims",
                format_args!("beat with superseded claim {og} accepted while claim {g} holds"),
            );
        }
        if self.lease.release_claim(old) {
            self.ctx.violate(
                "L3 stale claims",
                format_args!("release of superseded claim {og} succeeded while claim {g} holds"),
            );
        }
        let _ = self.lease.release_claim(&c);
    }

    /// One `with_lease` update whose closure takes a while (kills land inside it).
    fn with_lease(&mut self) {
        let think = match self.rng.below(100) {
            0..60 => self.rng.below(300),
            60..95 => self.rng.range(300, 3_000),
            _ => self.rng.range(3_000, 10_000),
        };
        let salt = self.rng.next_u64();
        let mut ran = 0;
        let lease = self.lease;
        let me = self.me;
        let r = lease.with_lease(me, GRACE, |p| {
            // The closure runs under our claim with the WRITE bit set: the current claim
            // is ours (no live writer is ever superseded).
            let g = lease
                .current_claim()
                .filter(|c| c.pid() == me)
                .map_or(0, |c| c.generation());
            ran = g;
            self.enter(g, None);
            let old = *p;
            if think > 0 {
                std::thread::sleep(Duration::from_micros(think));
            }
            let entered = self.aux.head(MAX_ENTERED).load(Ordering::SeqCst);
            let term = lease.lease_term();
            let released = self.released_by_sibling();
            *p = payload(old[0] + 1, g, me, old[1], salt);
            (old, g, entered, term, released)
        });
        match r {
            Some((old, g, entered, term, released)) => {
                self.ctx.bump(Stat::LeaseWithLease, 1);
                self.ctx.bump(Stat::LeaseClaims, 1);
                if !valid(&old) {
                    self.ctx.violate(
                        "L4 torn read",
                        format_args!("with_lease by claim {g} saw {old:x?}"),
                    );
                }
                self.log(old[0] + 1, g, old[1]);
                self.check_accepted(g, entered, term, released, "with_lease");
            }
            None if ran != 0 => {
                self.fenced(false);
            }
            None => self.ctx.bump(Stat::LeaseClaimFail, 1),
        }
    }

    /// A non-owner read of the published payload.
    fn observe(&mut self) {
        let st = self.lease.status();
        let p = st.payload_words;
        // All zeros: `status` gave up on a consistent read (diagnostics only).
        if p != [0; 6] {
            self.ctx.bump(Stat::LeaseReads, 1);
            if !valid(&p) {
                self.ctx.violate(
                    "L4 torn read",
                    format_args!("status() returned payload {p:x?}"),
                );
            }
        }
    }
}

/// Supervisor-side view of the lease during the run.
pub(crate) struct Monitor {
    lease: OwnerLease<Payload>,
    dead_holder: Option<(u32, u64, Instant)>,
    reported: bool,
}

impl Monitor {
    pub(crate) fn open(dir: &Path) -> Result<Self, String> {
        Ok(Monitor {
            lease: open_lease(dir)?,
            dead_holder: None,
            reported: false,
        })
    }

    /// The current holder's process id, if any (the chaos loop prefers it as a victim). With
    /// `writing`, waits up to `wait` for a holder that is in the middle of a write (or a
    /// `with_lease` closure), so kills and pauses land inside writes.
    /// Returns `(pid, writing)`.
    pub(crate) fn holder(&self, writing: bool, wait: Duration) -> Option<(u32, bool)> {
        let until = Instant::now() + wait;
        loop {
            let st = self.lease.status();
            if st.owner.is_some() && (st.writing || !writing || Instant::now() >= until) {
                return st.owner.map(|p| (process_of(p), st.writing));
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// L5 live check: a holder whose process is gone must be replaced promptly (workers
    /// keep trying to claim). Called every few milliseconds.
    pub(crate) fn check(&mut self, ctx: &Ctx, live_workers: usize) {
        let st = self.lease.status();
        // Dead = the whole process is gone. A zombie main thread is not enough: a
        // half-exited worker's other threads still run (and still hold).
        let dead = st.owner.filter(|&pid| match proc_status(process_of(pid)) {
            ProcStatus::Gone => true,
            ProcStatus::Zombie => proc_group_alive(process_of(pid)) == Some(false),
            _ => false,
        });
        match (dead, self.dead_holder) {
            (Some(pid), Some((p, g, since))) if p == pid && g == st.generation => {
                if !self.reported && live_workers > 0 && since.elapsed() > DEAD_HOLDER_LIMIT {
                    self.reported = true;
                    ctx.violate(
                        "L5 progress",
                        format_args!(
                            "holder pid {pid} (claim {g}, writing={}) is dead but not replaced after {:?}",
                            st.writing,
                            since.elapsed()
                        ),
                    );
                }
            }
            (Some(pid), _) => self.dead_holder = Some((pid, st.generation, Instant::now())),
            (None, _) => {
                self.dead_holder = None;
                self.reported = false;
            }
        }
    }
}

/// What the end-of-run check found.
#[derive(Debug, Default)]
pub(crate) struct Report {
    pub(crate) logged: u64,
    pub(crate) final_seq: u64,
    pub(crate) partial_records: u64,
    pub(crate) counters: Vec<(&'static str, u64)>,
    pub(crate) takeovers: u64,
    pub(crate) deaths: u64,
}

/// After every worker exited: merges the logs and checks the final state. `deaths` is
/// the number of lease worker processes that died without exiting (killed, crashed).
pub(crate) fn final_check(ctx: &Ctx, deaths: u64) -> Result<Report, String> {
    let mut report = Report::default();
    // Checked first, so that it is logged even when the log checks below report many
    // violations. A process holds at most one claim when it dies, so each death accounts
    // for at most one takeover as dead (the supervisor's final acquire included); more
    // means a live holder (e.g. a half-exited process, whose main thread is a zombie) was
    // judged dead.
    // A takeover through the holder's sentinel (the process was exiting) counts the same:
    // a live holder's sentinel never ends (the workers never exec).
    let counters = open_lease(&ctx.dir)?.status().counters;
    let (dead, exiting) = (
        counters[counter::CLAIM_DEAD],
        counters[counter::CLAIM_EXITING],
    );
    let dead_takeovers = dead + exiting;
    if dead_takeovers > deaths {
        ctx.violate(
            "L5 dead means gone",
            format_args!(
                "claim_dead_owner + claim_exiting is {dead} + {exiting}, but only {deaths} lease worker processes died"
            ),
        );
    }
    // seq -> (gen, prev_gen, pid)
    let mut by_seq: BTreeMap<u64, (u64, u64, u64)> = BTreeMap::new();
    let mut dups = 0u64;
    let dir = ctx.dir.join(LOG_DIR);
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("read {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let bytes = std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
        if bytes.len() % LOG_RECORD != 0 {
            report.partial_records += 1;
        }
        let mut last_seq = 0;
        for rec in bytes.chunks_exact(LOG_RECORD) {
            let f =
                |i: usize| u64::from_le_bytes(rec[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
            let (seq, g, prev, pid) = (f(0), f(1), f(2), f(3));
            report.logged += 1;
            if seq <= last_seq {
                ctx.violate(
                    "L1 exclusion",
                    format_args!("pid {pid} logged seq {seq} after seq {last_seq}"),
                );
            }
            last_seq = seq;
            if let Some(&(g0, _, pid0)) = by_seq.get(&seq) {
                dups += 1;
                if dups <= 10 {
                    ctx.violate(
                        "L1 exclusion",
                        format_args!(
                            "seq {seq} accepted twice: claim {g0} (pid {pid0}) and claim {g} (pid {pid})"
                        ),
                    );
                }
            } else {
                by_seq.insert(seq, (g, prev, pid));
            }
        }
    }
    let mut backwards = 0u64;
    let mut prev_entry: Option<(u64, u64)> = None;
    for (&seq, &(g, prev_gen, pid)) in &by_seq {
        if let Some((s0, g0)) = prev_entry {
            let bad = if g < g0 {
                Some(format!("generation went back from {g0} (seq {s0}) to {g}"))
            } else if s0 + 1 == seq && prev_gen != g0 {
                Some(format!(
                    "seq {seq} (claim {g}) read the payload of claim {prev_gen}, but seq {s0} was written by claim {g0}"
                ))
            } else {
                None
            };
            if let Some(msg) = bad {
                backwards += 1;
                if backwards <= 10 {
                    ctx.violate("L2 fencing", format_args!("pid {pid}: {msg}"));
                }
            }
        }
        prev_entry = Some((seq, g));
    }
    if dups > 10 || backwards > 10 {
        ctx.violate(
            "L1/L2",
            format_args!("{dups} duplicate seqs and {backwards} order errors in total"),
        );
    }

    // The final state: a consistent payload, agreeing with the logs, and the lease can be
    // claimed (every worker is gone, so a remaining holder is dead and replaced at once).
    let lease = open_lease(&ctx.dir)?;
    let me = std::process::id();
    match lease.acquire(me, GRACE, Duration::from_secs(5)) {
        Some(c) => {
            let p = lease.read_claimed(&c).unwrap_or_default();
            if !valid(&p) {
                ctx.violate(
                    "L4 torn read",
                    format_args!("final payload {p:x?} fails its checksum"),
                );
            }
            report.final_seq = p[0];
            if let Some((&max_seq, _)) = by_seq.last_key_value()
                && p[0] < max_seq
            {
                ctx.violate(
                    "L2 fencing",
                    format_args!("final seq {} is below logged seq {max_seq}", p[0]),
                );
            }
            if let Some(&(g, _, _)) = by_seq.get(&p[0])
                && g != p[1]
            {
                ctx.violate(
                    "L2 fencing",
                    format_args!(
                        "final payload seq {} written by claim {}, log says claim {g}",
                        p[0], p[1]
                    ),
                );
            }
            let restored = payload(p[0], c.generation(), me, p[1], 0);
            if !lease.write_claimed(&c, restored) || !lease.release_claim(&c) {
                ctx.violate(
                    "L2 fencing",
                    format_args!("the supervisor's final write/release was refused"),
                );
            }
        }
        None => {
            let st = lease.status();
            ctx.violate(
                "L5 progress",
                format_args!(
                    "cannot claim the lease after all workers exited: owner {:?}, writing={}",
                    st.owner, st.writing
                ),
            );
        }
    }
    let st = lease.status();
    report.counters = counter::NAMES
        .iter()
        .zip(st.counters)
        .map(|(n, v)| (*n, v))
        .collect();
    report.deaths = deaths;
    report.takeovers = st.counters[counter::CLAIM_PREEMPT]
        + st.counters[counter::CLAIM_STALE]
        + st.counters[counter::CLAIM_DEAD];
    Ok(report)
}
