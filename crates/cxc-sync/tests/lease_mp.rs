//! Multi-process tests of [`OwnerLease`] with real child processes (DESIGN §3, L1–L6).
//!
//! Each test re-executes this test binary as child processes (`CXC_LEASE_ROLE=<role>`,
//! parameters in `CXC_LEASE_*` variables); a test function that finds the role variable
//! set plays that role and exits instead of running the parent side. Children are killed
//! with SIGKILL, paused with SIGSTOP/SIGCONT, and parent and children synchronise through
//! the lease file itself (owner, generation, counters) or small marker files, never through
//! sleeps alone.
//!
//! Pids: a claim made for the caller's own pid records the process start time, so its death
//! is seen at once (identity path); a claim made for any other number has no OS identity
//! and fails over only when its heartbeat is more than `grace` epochs old (heartbeat path).
//! Fake pids are above `PID_MAX_LIMIT` (2^22), so they never name a real process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, TypeFingerprint};
use cxc_sync::lease::counter;
use cxc_sync::liveness::{ProcStatus, proc_status};
use cxc_sync::{LeaseOptions, OwnerLease, Preemption};

// ---------------------------------------------------------------------------------------
// Child-process plumbing
// ---------------------------------------------------------------------------------------

const ROLE_VAR: &str = "CXC_LEASE_ROLE";
const PATH_VAR: &str = "CXC_LEASE_PATH";
/// A second file: control block, marker or "go" file depending on the test.
const AUX_VAR: &str = "CXC_LEASE_AUX";
/// Where the child writes its `key=value` report.
const REPORT_VAR: &str = "CXC_LEASE_REPORT";
const GRACE_VAR: &str = "CXC_LEASE_GRACE";
const COUNT_VAR: &str = "CXC_LEASE_N";

/// Fake pids for children: above `PID_MAX_LIMIT` (4 194 304), never a real process.
const FAKE_CHILD_BASE: u32 = 10_000_000;
/// Fake pids for the parent: lower than every child's fake pid, so under
/// [`Preemption::LowerPid`] the parent would preempt at once.
const FAKE_PARENT_BASE: u32 = 5_000_000;

/// How long a child waits for its parent before giving up (the parent has failed then).
const CHILD_PATIENCE: Duration = Duration::from_secs(20);

/// If this process is a child, play its role and exit; otherwise return.
fn child_dispatch() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    match role.as_str() {
        "beater" => role_beater(),
        "holder" => role_holder(),
        "writer" => role_writer(),
        "hammer" => role_hammer(),
        "paused" => role_paused(),
        "closure" => role_closure(),
        other => panic!("unknown child role {other:?}"),
    }
    std::process::exit(0);
}

fn env_path(var: &str) -> PathBuf {
    PathBuf::from(std::env::var_os(var).unwrap_or_else(|| panic!("child needs {var}")))
}

fn env_u64(var: &str) -> u64 {
    std::env::var(var)
        .unwrap_or_else(|_| panic!("child needs {var}"))
        .parse()
        .unwrap_or_else(|_| panic!("{var} is not a number"))
}

/// Writes the child's report atomically (temporary file + rename).
fn report(text: &str) {
    let path = env_path(REPORT_VAR);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write report");
    std::fs::rename(&tmp, &path).expect("publish report");
}

/// Parses a `key=value key=value` report.
fn report_value(text: &str, key: &str) -> String {
    text.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("report {text:?} has no {key}"))
        .to_string()
}

fn report_u64(text: &str, key: &str) -> u64 {
    report_value(text, key)
        .parse()
        .expect("numeric report value")
}

fn report_bool(text: &str, key: &str) -> bool {
    report_value(text, key)
        .parse()
        .expect("boolean report value")
}

/// Waits (in a child) until `path` exists; exits with code 4 if the parent never creates it.
fn child_wait_for_file(path: &Path) {
    let deadline = Instant::now() + CHILD_PATIENCE;
    while !path.exists() {
        if Instant::now() > deadline {
            std::process::exit(4);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A child process; killed and reaped on drop so a failing parent leaves no strays.
struct Kid {
    child: Child,
    reaped: Option<ExitStatus>,
}

impl Kid {
    fn spawn(test: &str, role: &str, envs: &[(&str, &dyn AsRef<std::ffi::OsStr>)]) -> Kid {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        // `--include-ignored`: the child must run its role even for an ignored test.
        cmd.args([
            test,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .env(ROLE_VAR, role)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        Kid {
            child: cmd.spawn().expect("spawn child"),
            reaped: None,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` once the child has exited (reaps it).
    fn exited(&mut self) -> Option<ExitStatus> {
        if self.reaped.is_none() {
            self.reaped = self.child.try_wait().expect("try_wait");
        }
        self.reaped
    }

    /// SIGKILL, without reaping (the child stays a zombie until [`Kid::reap`]).
    fn sigkill(&mut self) {
        self.child.kill().expect("SIGKILL child");
    }

    fn signal(&self, sig: rustix::process::Signal) {
        let pid = i32::try_from(self.pid())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .expect("child pid");
        rustix::process::kill_process(pid, sig).expect("signal child");
    }

    fn reap(&mut self) -> ExitStatus {
        if let Some(s) = self.reaped {
            return s;
        }
        let s = self.child.wait().expect("wait child");
        self.reaped = Some(s);
        s
    }

    /// Waits for the child to exit on its own within `timeout`.
    fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "child {} did not exit within {timeout:?}",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Polls `cond` until it holds; fails if the child exits first or `timeout` passes.
    fn wait_for(&mut self, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if cond() {
                return;
            }
            if let Some(s) = self.exited() {
                panic!(
                    "child {} exited ({s}) while waiting for: {what}",
                    self.pid()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out ({timeout:?}) waiting for: {what}"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Waits until the SIGKILLed child is a zombie (dead, not reaped).
    fn wait_for_zombie(&mut self) {
        let pid = self.pid();
        let deadline = Instant::now() + Duration::from_secs(5);
        while proc_status(pid) != ProcStatus::Zombie {
            assert!(
                Instant::now() < deadline,
                "child {pid} did not die after SIGKILL"
            );
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Waits until `/proc` shows the child stopped (after SIGSTOP).
    fn wait_stopped(&mut self) {
        let pid = self.pid();
        self.wait_for("child stopped", Duration::from_secs(5), || {
            proc_state(pid) == Some('T')
        });
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The state letter of `/proc/<pid>/stat` (field 3).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

fn never() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    }
}

fn wait_exit_ok(kid: &mut Kid, timeout: Duration) {
    let s = kid.wait_exit(timeout);
    assert!(s.success(), "child {} failed: {s}", kid.child.id());
}

/// A small xorshift64* generator (no extra dependency), seeded from the clock and pid.
struct Rng(u64);

impl Rng {
    fn seeded() -> (Rng, u64) {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos() as u64;
        let seed = (t ^ u64::from(std::process::id()).rotate_left(32)) | 1;
        (Rng(seed), seed)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

// ---------------------------------------------------------------------------------------
// 1. Heartbeat failover
// ---------------------------------------------------------------------------------------

/// Child: claims with a fake pid and beats about every millisecond.
fn role_beater() {
    let lease = OwnerLease::<u64>::open(env_path(PATH_VAR)).expect("open lease");
    let grace = env_u64(GRACE_VAR);
    let fake = FAKE_CHILD_BASE + std::process::id();
    let claim = lease.try_claim(fake, grace).expect("lease is vacant");
    let mut i = 0u64;
    loop {
        i += 1;
        // Both beat flavours; a refused beat means the lease was lost while alive.
        let ok = if i % 2 == 0 {
            lease.beat_claimed(&claim)
        } else {
            lease.beat(fake)
        };
        if !ok {
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// L5 (heartbeat): a beating holder is never taken over, and once it is stopped (SIGSTOP:
/// alive, so only its heartbeat can tell) the standby takes over at exactly the first
/// epoch where `epoch - heartbeat > grace`, with a higher generation. [`Preemption::Never`]
/// with a standby pid lower than the holder's also checks that `Never` really does not
/// preempt.
#[test]
fn standby_takes_over_after_sigstop_heartbeat_path() {
    child_dispatch();
    const GRACE: u64 = 150;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("hb.lease");
    let lease = OwnerLease::<u64>::create_with(&path, 0, &never()).expect("create");
    let mut kid = Kid::spawn(
        "standby_takes_over_after_sigstop_heartbeat_path",
        "beater",
        &[(PATH_VAR, &path), (GRACE_VAR, &GRACE.to_string())],
    );
    let child_fake = FAKE_CHILD_BASE + kid.pid();
    let me = FAKE_PARENT_BASE + std::process::id();
    assert!(me < child_fake);
    kid.wait_for("child holds the lease", Duration::from_secs(5), || {
        lease.current_owner() == Some(child_fake)
    });
    let child_gen = lease.lease_term();
    let hb_before = lease.status().heartbeat_epoch;

    // Alive phase: tick about every millisecond for 3 x grace epochs; the child beats.
    for ticks in 1..=3 * GRACE {
        lease.tick_epoch();
        assert!(
            !lease.try_acquire(me, GRACE),
            "standby took over a live, beating holder after {ticks} ticks: {:?}",
            lease.status()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(kid.exited().is_none(), "child lost the lease while alive");
    let st = lease.status();
    assert_eq!(st.owner, Some(child_fake));
    assert!(
        st.heartbeat_epoch > hb_before + GRACE,
        "the child's beats did not move the heartbeat: {st:?}"
    );

    // SIGSTOP: after this no beat can land, and the OS still says the holder lives.
    kid.signal(rustix::process::Signal::STOP);
    kid.wait_stopped();
    let hb = lease.status().heartbeat_epoch;
    let e0 = lease.current_epoch();
    let t0 = Instant::now();
    let (claim, at) = loop {
        let now = lease.tick_epoch();
        if let Some(c) = lease.try_claim(me, GRACE) {
            break (c, now);
        }
        assert!(
            now <= hb.max(e0) + GRACE + 1,
            "no takeover at epoch {now} (heartbeat {hb}, grace {GRACE})"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let expected = (hb + GRACE + 1).max(e0 + 1);
    assert_eq!(
        at, expected,
        "takeover must happen at the first stale epoch (heartbeat {hb}, grace {GRACE})"
    );
    assert_eq!(
        claim.generation(),
        child_gen + 1,
        "generation must increase"
    );
    assert_eq!(lease.lease_term(), child_gen + 1);
    assert_eq!(lease.current_owner(), Some(me));
    assert!(!claim.payload_may_be_inconsistent());
    assert_eq!(lease.status().counters[counter::CLAIM_STALE], 1);
    println!(
        "heartbeat path: takeover {} ticks after the stop (grace {GRACE}), {:?} wall time",
        at - e0,
        t0.elapsed()
    );
    kid.sigkill();
    kid.reap();
}

// ---------------------------------------------------------------------------------------
// 2. OS-identity failover
// ---------------------------------------------------------------------------------------

const NO_STALENESS: u64 = u64::MAX / 2;

/// Child: claims with its real pid and never beats.
fn role_holder() {
    let lease = OwnerLease::<u64>::open(env_path(PATH_VAR)).expect("open lease");
    let _claim = lease
        .try_claim(std::process::id(), NO_STALENESS)
        .expect("lease is vacant");
    loop {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// L5 (identity): a holder that claimed with its own pid is replaced at once when it is
/// SIGKILLed, while still an unreaped zombie, both by a blocked `acquire` (woken from its
/// futex sleep by the periodic pidfd check) and by polling `try_claim`. Staleness can
/// never trigger (grace = u64::MAX/2, no ticks) and preemption is off, so only the OS
/// identity can explain the takeover. Before the kill, neither path takes the live holder.
#[test]
fn standby_takes_over_after_sigkill_identity_path() {
    child_dispatch();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("id.lease");
    let lease = OwnerLease::<u64>::create_with(&path, 0, &never()).expect("create");
    let me = std::process::id();
    let spawn_holder = |lease: &OwnerLease<u64>| {
        let mut kid = Kid::spawn(
            "standby_takes_over_after_sigkill_identity_path",
            "holder",
            &[(PATH_VAR, &path)],
        );
        let pid = kid.pid();
        kid.wait_for(
            "child holds the lease with a recorded identity",
            Duration::from_secs(5),
            || {
                let st = lease.status();
                st.owner == Some(pid) && st.owner_start.is_some()
            },
        );
        kid
    };

    // Round 1: a blocked `acquire`.
    let mut kid = spawn_holder(&lease);
    let gen1 = lease.lease_term();
    let t = Instant::now();
    assert!(
        lease
            .acquire(me, NO_STALENESS, Duration::from_millis(300))
            .is_none(),
        "acquire took the lease from a live holder"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "acquire returned early"
    );
    let waits_before = lease.status().counters[counter::BLOCKED_WAITS];
    let (claim, latency) = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let c = lease.acquire(me, NO_STALENESS, Duration::from_secs(5));
            (c, Instant::now())
        });
        // The waiter is asleep in the kernel once it has counted a blocked wait.
        kid.wait_for("acquirer is blocked", Duration::from_secs(5), || {
            lease.status().counters[counter::BLOCKED_WAITS] > waits_before
        });
        let killed_at = Instant::now();
        kid.sigkill();
        let (c, got_at) = waiter.join().expect("acquirer thread");
        (c, got_at.saturating_duration_since(killed_at))
    });
    // Not reaped yet: the dead holder is a zombie, and must have counted as dead.
    assert_eq!(proc_status(kid.pid()), ProcStatus::Zombie);
    let claim = claim.expect("blocked acquire did not take over from the killed holder");
    kid.reap();
    println!("identity path: blocked acquire took over {latency:?} after SIGKILL");
    assert!(
        latency < Duration::from_secs(1),
        "takeover took {latency:?} after SIGKILL"
    );
    assert_eq!(claim.generation(), gen1 + 1);
    assert!(lease.release_claim(&claim));

    // Round 2: polling `try_claim`.
    let mut kid = spawn_holder(&lease);
    let gen2 = lease.lease_term();
    assert!(lease.try_claim(me, NO_STALENESS).is_none());
    let killed_at = Instant::now();
    kid.sigkill();
    let claim = loop {
        if let Some(c) = lease.try_claim(me, NO_STALENESS) {
            break c;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(5),
            "try_claim never took over from the killed holder: {:?}",
            lease.status()
        );
        std::thread::yield_now();
    };
    let latency = killed_at.elapsed();
    assert_eq!(proc_status(kid.pid()), ProcStatus::Zombie);
    kid.reap();
    println!("identity path: polling try_claim took over {latency:?} after SIGKILL");
    assert!(
        latency < Duration::from_secs(1),
        "takeover took {latency:?} after SIGKILL"
    );
    assert_eq!(claim.generation(), gen2 + 1);
    assert_eq!(lease.status().counters[counter::CLAIM_DEAD], 2);
    assert_eq!(lease.status().counters[counter::CLAIM_STALE], 0);
}

// ---------------------------------------------------------------------------------------
// 3. Killed mid-write
// ---------------------------------------------------------------------------------------

type Words = [u64; 6];

fn checksum(w: &Words) -> u64 {
    let mut h = 0xCBF2_9CE4_8422_2325u64;
    for x in &w[..5] {
        h ^= *x;
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
        h ^= h >> 29;
    }
    h
}

fn payload(seq: u64) -> Words {
    let mut w: Words = std::array::from_fn(|i| {
        (seq ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9)
    });
    w[0] = seq;
    w[5] = checksum(&w);
    w
}

fn valid(w: &Words) -> bool {
    w[5] == checksum(w)
}

const WRITER_GRACE: u64 = 1_000;

/// Child: holds the lease with its real pid and publishes checksummed payloads as fast as
/// it can, through `write_claimed`, `with_lease` on the held lease, and every 512 updates
/// a release + `with_lease` on a fresh claim (closure under the write flag) + re-claim.
fn role_writer() {
    let lease = OwnerLease::<Words>::open(env_path(PATH_VAR)).expect("open lease");
    let me = std::process::id();
    let mut claim = lease.try_claim(me, WRITER_GRACE).expect("lease is vacant");
    let mut cur = lease.read_claimed(&claim).expect("read as holder");
    if !valid(&cur) {
        std::process::exit(5);
    }
    let step = |p: &mut Words| {
        if !valid(p) {
            std::process::exit(6);
        }
        *p = payload(p[0] + 1);
        *p
    };
    let mut i = 0u64;
    loop {
        i += 1;
        if i % 512 == 0 {
            assert!(lease.release_claim(&claim));
            cur = lease
                .with_lease(me, WRITER_GRACE, |p| {
                    // Stay in the closure a little, so kills land here too.
                    let mut x = p[1];
                    for _ in 0..2_000 {
                        x = std::hint::black_box(x.rotate_left(7) ^ 0x55);
                    }
                    std::hint::black_box(x);
                    step(p)
                })
                .expect("with_lease on a vacant lease");
            claim = lease.try_claim(me, WRITER_GRACE).expect("lease is vacant");
        } else if i % 64 == 0 {
            cur = lease
                .with_lease(me, WRITER_GRACE, step)
                .expect("with_lease on a held lease");
        } else {
            let next = payload(cur[0] + 1);
            assert!(
                lease.write_claimed(&claim, next),
                "held claim refused a write"
            );
            cur = next;
        }
    }
}

/// L4: a holder SIGKILLed at a random point of its write loop never leaves a torn payload;
/// the next holder reads the last published value (checksum verifies, sequence never goes
/// backwards) and is told when the dead holder was mid-update. 24 rounds on one file.
#[test]
fn writer_killed_mid_write_never_exposes_torn_payload() {
    child_dispatch();
    const ROUNDS: usize = 24;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("torn.lease");
    let lease = OwnerLease::<Words>::create_with(&path, payload(0), &never()).expect("create");
    let me = std::process::id();
    let (mut rng, seed) = Rng::seeded();
    let mut last_seq = 0u64;
    let mut torn_rounds = 0usize;
    let mut progressed = 0usize;
    let mut no_identity = 0usize;
    for round in 0..ROUNDS {
        let mut kid = Kid::spawn(
            "writer_killed_mid_write_never_exposes_torn_payload",
            "writer",
            &[(PATH_VAR, &path)],
        );
        let pid = kid.pid();
        kid.wait_for("child holds the lease", Duration::from_secs(5), || {
            lease.current_owner() == Some(pid)
        });
        std::thread::sleep(Duration::from_millis(rng.range(1, 30)));
        if let Some(s) = kid.exited() {
            panic!("round {round}: writer exited early ({s}); seed {seed:#x}");
        }
        kid.sigkill();
        // Dead for certain (a zombie, not reaped) before anyone takes over.
        kid.wait_for_zombie();
        let t0 = Instant::now();
        let claim = loop {
            if let Some(c) = lease.acquire(me, WRITER_GRACE, Duration::from_millis(200)) {
                break c;
            }
            // Killed between its claim CAS and recording its start time: that claim has
            // no OS identity, so only its heartbeat can expire.
            if lease.status().owner_start.is_none() {
                no_identity += 1;
                for _ in 0..=WRITER_GRACE {
                    lease.tick_epoch();
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "round {round}: no takeover from the killed writer: {:?}",
                lease.status()
            );
        };
        let torn = claim.payload_may_be_inconsistent();
        assert_eq!(lease.payload_torn(), torn);
        let v = lease.read_claimed(&claim).expect("read as the new holder");
        assert!(
            valid(&v),
            "round {round}: torn payload exposed: {v:x?} (seed {seed:#x}, torn flag {torn})"
        );
        assert_eq!(
            v,
            payload(v[0]),
            "round {round}: payload is not one that was written"
        );
        assert!(
            v[0] >= last_seq,
            "round {round}: sequence went backwards {last_seq} -> {}",
            v[0]
        );
        if v[0] > last_seq {
            progressed += 1;
        }
        last_seq = v[0];
        if torn {
            torn_rounds += 1;
            // Restore: a successful write by the new holder clears the flag.
            assert!(lease.write_claimed(&claim, v));
            assert!(!lease.payload_torn());
        }
        assert!(lease.release_claim(&claim));
        kid.reap();
    }
    println!(
        "killed-writer rounds: {ROUNDS}, reported payload_may_be_inconsistent: {torn_rounds}, \
         without identity: {no_identity}, with progress: {progressed}, final seq {last_seq}, \
         seed {seed:#x}"
    );
    assert!(progressed > 0, "the writers never published anything");
    assert_eq!(
        lease.status().counters[counter::TORN_INHERITED],
        torn_rounds as u64
    );
}

// ---------------------------------------------------------------------------------------
// 4. No lost update under contention
// ---------------------------------------------------------------------------------------

/// Control block words (a `Kind::Test` file with a 64-byte head).
const W_INSIDE: usize = 0;
const W_VIOLATIONS: usize = 1;
const W_READY: usize = 2;
const W_GO: usize = 3;

type Ctl = Mapped<[AtomicU64; 8]>;

fn ctl_layout() -> Layout {
    Layout {
        kind: Kind::Test,
        head_size: 64,
        slot_size: 0,
        capacity: 0,
        payload: TypeFingerprint::NONE,
        params: [0; 4],
    }
}

fn ctl_expect() -> Expect<'static> {
    Expect {
        kind: Kind::Test,
        head_size: 64,
        slot_size: 0,
        capacity: Some(0),
        max_capacity: 0,
        payload: TypeFingerprint::NONE,
        check_params: &|_| Ok(()),
    }
}

const HAMMER_GRACE: u64 = 1_000;

/// Child: performs `N` successful increments, alternating `with_lease` and
/// `try_claim` + `read_claimed` + `write_claimed` + `release_claim`.
fn role_hammer() {
    let lease = OwnerLease::<u64>::open(env_path(PATH_VAR)).expect("open lease");
    let ctl = Ctl::open(env_path(AUX_VAR), &ctl_expect()).expect("open control file");
    let n = env_u64(COUNT_VAR);
    let c = ctl.head();
    c[W_READY].fetch_add(1, Ordering::SeqCst);
    let deadline = Instant::now() + CHILD_PATIENCE;
    while c[W_GO].load(Ordering::SeqCst) == 0 {
        if Instant::now() > deadline {
            std::process::exit(4);
        }
        std::thread::yield_now();
    }
    let me = std::process::id();
    let (mut ok_with, mut ok_claim, mut lost_writes, mut violations, mut i) = (0, 0, 0, 0, 0u64);
    while ok_with + ok_claim < n {
        i += 1;
        if i % 2 == 0 {
            let r = lease.with_lease(me, HAMMER_GRACE, |v| {
                if c[W_INSIDE].fetch_add(1, Ordering::SeqCst) != 0 {
                    c[W_VIOLATIONS].fetch_add(1, Ordering::SeqCst);
                    violations += 1;
                }
                *v += 1;
                // Stay inside a little, so an overlapping closure would be seen.
                for _ in 0..100 {
                    std::hint::spin_loop();
                }
                c[W_INSIDE].fetch_sub(1, Ordering::SeqCst);
            });
            if r.is_some() {
                ok_with += 1;
            }
        } else if let Some(claim) = lease.try_claim(me, HAMMER_GRACE) {
            match lease.read_claimed(&claim) {
                Some(v) if lease.write_claimed(&claim, v + 1) => ok_claim += 1,
                // Preempted between claim and write: the write must be refused.
                _ => lost_writes += 1,
            }
            lease.release_claim(&claim);
        }
    }
    report(&format!(
        "with={ok_with} claimed={ok_claim} refused={lost_writes} attempts={i} violations={violations}"
    ));
}

/// L1 + L2 under contention: two processes (default `LowerPid` preemption, so the lower
/// pid preempts the other between its claim and its write) each make N successful
/// increments; the final payload equals the sum of successes (no lost or phantom update),
/// and no two `with_lease` closures ever overlap (a shared "inside" counter).
#[test]
fn two_processes_no_lost_update() {
    child_dispatch();
    const N: u64 = 20_000;
    const TEST: &str = "two_processes_no_lost_update";
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("count.lease");
    let ctl_path = dir.path().join("ctl.cxc");
    let lease = OwnerLease::<u64>::create(&path, 0).expect("create");
    let ctl = Ctl::create(
        &ctl_path,
        ctl_layout(),
        &CreateOptions::default(),
        |_, _| {},
    )
    .expect("create control file");
    let c = ctl.head();
    let reports: Vec<PathBuf> = (0..2).map(|k| dir.path().join(format!("r{k}"))).collect();
    let n = N.to_string();
    let mut kids = Vec::new();
    for (k, rep) in reports.iter().enumerate() {
        let mut kid = Kid::spawn(
            TEST,
            "hammer",
            &[
                (PATH_VAR, &path),
                (AUX_VAR, &ctl_path),
                (COUNT_VAR, &n),
                (REPORT_VAR, rep),
            ],
        );
        kid.wait_for("child ready", Duration::from_secs(5), || {
            c[W_READY].load(Ordering::SeqCst) == k as u64 + 1
        });
        if k == 0 {
            // Start times are recorded in 10 ms clock ticks; make the two children's
            // differ so that confusing one's identity with the other's would show.
            std::thread::sleep(Duration::from_millis(25));
        }
        kids.push(kid);
    }
    let t0 = Instant::now();
    c[W_GO].store(1, Ordering::SeqCst);
    for kid in &mut kids {
        wait_exit_ok(kid, Duration::from_secs(8));
    }
    let elapsed = t0.elapsed();
    let mut total = 0;
    for (kid, rep) in kids.iter().zip(&reports) {
        let text = std::fs::read_to_string(rep).expect("child report");
        let (with, claimed) = (report_u64(&text, "with"), report_u64(&text, "claimed"));
        println!("child {}: {text}", kid.pid());
        assert_eq!(with + claimed, N);
        assert!(
            with > 0 && claimed > 0,
            "both update paths must be exercised: {text}"
        );
        assert_eq!(report_u64(&text, "violations"), 0);
        total += with + claimed;
    }
    let me = std::process::id();
    let claim = lease.try_claim(me, HAMMER_GRACE).expect("lease is free");
    let value = lease.read_claimed(&claim).expect("read");
    let st = lease.status();
    println!(
        "final {value}, expected {total}, {elapsed:?}; preemptions {}, refused ops {}",
        st.counters[counter::CLAIM_PREEMPT],
        st.counters[counter::STALE_OP_REJECTED]
    );
    assert_eq!(
        c[W_VIOLATIONS].load(Ordering::SeqCst),
        0,
        "with_lease closures overlapped"
    );
    assert_eq!(c[W_INSIDE].load(Ordering::SeqCst), 0);
    assert_eq!(value, total, "lost or phantom updates");
    assert_eq!(
        st.counters[counter::CLAIM_DEAD],
        0,
        "a live child was taken as dead"
    );
    assert_eq!(st.counters[counter::CLAIM_STALE], 0);
}

// ---------------------------------------------------------------------------------------
// 5. Paused owner is fenced
// ---------------------------------------------------------------------------------------

const PAUSE_GRACE: u64 = 10;

/// Child: claims with a fake pid, writes 111, creates the marker file, waits for the go
/// file, then tries every owner operation with its old claim and reports the results.
fn role_paused() {
    let lease = OwnerLease::<u64>::open(env_path(PATH_VAR)).expect("open lease");
    let aux = env_path(AUX_VAR);
    let fake = FAKE_CHILD_BASE + std::process::id();
    let claim = lease.try_claim(fake, PAUSE_GRACE).expect("lease is vacant");
    assert!(lease.write_claimed(&claim, 111));
    std::fs::write(aux.with_extension("held"), b"").expect("marker");
    child_wait_for_file(&aux.with_extension("go"));
    let write = lease.write_claimed(&claim, 0xBAD);
    let beat = lease.beat_claimed(&claim);
    let release = lease.release_claim(&claim);
    let current = lease.is_current(&claim);
    let read = lease.read_claimed(&claim).is_some();
    let write_pid = lease.write_as_owner(fake, 0xBAD2);
    let read_pid = lease.read_as_owner(fake).is_some();
    let beat_pid = lease.beat(fake);
    let release_pid = lease.release(fake);
    let with = lease
        .with_lease(fake, PAUSE_GRACE, |v| *v = 0xBAD3)
        .is_some();
    report(&format!(
        "write={write} beat={beat} release={release} current={current} read={read} \
         write_pid={write_pid} read_pid={read_pid} beat_pid={beat_pid} \
         release_pid={release_pid} with={with}"
    ));
}

/// L2 + L3: a holder paused (SIGSTOP) past its grace is taken over; once resumed, every
/// operation with its old claim or pid (write, beat, release, read, with_lease) fails,
/// and the new holder keeps the lease and its value.
#[test]
fn paused_owner_write_rejected_after_takeover() {
    child_dispatch();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("paused.lease");
    let aux = dir.path().join("sig");
    let rep = dir.path().join("report");
    let lease = OwnerLease::<u64>::create_with(&path, 0, &never()).expect("create");
    let mut kid = Kid::spawn(
        "paused_owner_write_rejected_after_takeover",
        "paused",
        &[(PATH_VAR, &path), (AUX_VAR, &aux), (REPORT_VAR, &rep)],
    );
    let fake = FAKE_CHILD_BASE + kid.pid();
    kid.wait_for(
        "child holds the lease and wrote",
        Duration::from_secs(5),
        || lease.current_owner() == Some(fake) && aux.with_extension("held").exists(),
    );
    kid.signal(rustix::process::Signal::STOP);
    kid.wait_stopped();
    let old_gen = lease.lease_term();
    let me = std::process::id();
    let hb = lease.status().heartbeat_epoch;
    while lease.current_epoch() < hb + PAUSE_GRACE {
        lease.tick_epoch();
        assert!(
            lease.try_claim(me, PAUSE_GRACE).is_none(),
            "took over within grace"
        );
    }
    lease.tick_epoch();
    let mine = lease
        .try_claim(me, PAUSE_GRACE)
        .expect("stale holder is taken over");
    assert_eq!(mine.generation(), old_gen + 1);
    assert!(
        !mine.payload_may_be_inconsistent(),
        "the paused holder was not writing"
    );
    assert_eq!(lease.read_claimed(&mine), Some(111));
    assert!(lease.write_claimed(&mine, 222));
    std::fs::write(aux.with_extension("go"), b"").expect("go file");
    kid.signal(rustix::process::Signal::CONT);
    wait_exit_ok(&mut kid, Duration::from_secs(5));
    let text = std::fs::read_to_string(&rep).expect("child report");
    println!("resumed old holder: {text}");
    for key in [
        "write",
        "beat",
        "release",
        "current",
        "read",
        "write_pid",
        "read_pid",
        "beat_pid",
        "release_pid",
        "with",
    ] {
        assert!(
            !report_bool(&text, key),
            "stale holder's {key} succeeded: {text}"
        );
    }
    assert!(lease.is_current(&mine));
    assert_eq!(lease.current_owner(), Some(me));
    assert_eq!(lease.lease_term(), mine.generation());
    assert_eq!(lease.read_claimed(&mine), Some(222));
    assert!(lease.release_claim(&mine));
}

// ---------------------------------------------------------------------------------------
// 6.-8. Paused in the middle of a `with_lease` closure
// ---------------------------------------------------------------------------------------

/// Child: runs `with_lease` (real or fake pid, per `CXC_LEASE_N`: 1 = real) whose closure
/// creates the marker file, waits for the go file and stores 0xBAD; reports whether
/// `with_lease` published.
fn role_closure() {
    let lease = OwnerLease::<u64>::open(env_path(PATH_VAR)).expect("open lease");
    let aux = env_path(AUX_VAR);
    let pid = if env_u64(COUNT_VAR) == 1 {
        std::process::id()
    } else {
        FAKE_CHILD_BASE + std::process::id()
    };
    let r = lease.with_lease(pid, PAUSE_GRACE, |v| {
        std::fs::write(aux.with_extension("inside"), b"").expect("marker");
        child_wait_for_file(&aux.with_extension("go"));
        *v = 0xBAD;
    });
    report(&format!("published={}", r.is_some()));
}

/// Starts a `role_closure` child and waits until it is stopped inside its closure.
fn stopped_in_closure(test: &str, path: &Path, aux: &Path, rep: &Path, real_pid: bool) -> Kid {
    let mode = if real_pid { "1" } else { "0" };
    let mut kid = Kid::spawn(
        test,
        "closure",
        &[
            (PATH_VAR, &path),
            (AUX_VAR, &aux),
            (REPORT_VAR, &rep),
            (COUNT_VAR, &mode),
        ],
    );
    kid.wait_for("child inside its closure", Duration::from_secs(5), || {
        aux.with_extension("inside").exists()
    });
    kid.signal(rustix::process::Signal::STOP);
    kid.wait_stopped();
    kid
}

/// L5 + L7: a live holder stopped (SIGSTOP) in the middle of a `with_lease` closure is
/// replaced once its heartbeat is older than the grace; the new holder is told the payload
/// may be inconsistent, reads the last published value and writes its own. When the old
/// holder is continued, its closure's update is never published, its staging buffer
/// leaves quarantine, and the new holder's value stays.
fn stopped_writer_is_replaced_and_never_published(test: &str, real_pid: bool) {
    child_dispatch();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("mid.lease");
    let (aux, rep) = (dir.path().join("sig"), dir.path().join("report"));
    let lease = OwnerLease::<u64>::create_with(&path, 1, &never()).expect("create");
    let mut kid = stopped_in_closure(test, &path, &aux, &rep, real_pid);
    let pid = if real_pid {
        kid.pid()
    } else {
        FAKE_CHILD_BASE + kid.pid()
    };
    let st = lease.status();
    assert!(
        st.writing && st.owner == Some(pid) && st.owner_start.is_some(),
        "{st:?}"
    );
    let me = std::process::id();
    let hb = st.heartbeat_epoch;
    while lease.current_epoch() < hb + PAUSE_GRACE {
        lease.tick_epoch();
        assert!(
            lease.try_claim(me, PAUSE_GRACE).is_none(),
            "took over within grace"
        );
    }
    lease.tick_epoch();
    let mine = lease
        .acquire(me, PAUSE_GRACE, Duration::from_secs(2))
        .expect("a stopped writer is replaced after the grace");
    assert!(mine.payload_may_be_inconsistent());
    assert_eq!(lease.read_claimed(&mine), Some(1));
    assert!(lease.write_claimed(&mine, 222));
    assert_eq!(lease.status().counters[counter::QUARANTINED], 1);
    std::fs::write(aux.with_extension("go"), b"").expect("go file");
    kid.signal(rustix::process::Signal::CONT);
    wait_exit_ok(&mut kid, Duration::from_secs(5));
    let text = std::fs::read_to_string(&rep).expect("child report");
    assert!(!report_bool(&text, "published"), "{text}");
    assert!(lease.is_current(&mine));
    assert_eq!(
        lease.read_claimed(&mine),
        Some(222),
        "the stale write appeared"
    );
    // The stale writer freed its quarantined buffer; further writes keep working.
    let st = lease.status();
    assert_eq!(st.counters[counter::QUARANTINE_FREED], 1, "{st:?}");
    for v in 0..20 {
        assert!(lease.write_claimed(&mine, 300 + v));
    }
    assert_eq!(lease.read_claimed(&mine), Some(319));
    assert!(lease.release_claim(&mine));
}

#[test]
fn paused_real_pid_writer_is_replaced_and_never_published() {
    stopped_writer_is_replaced_and_never_published(
        "paused_real_pid_writer_is_replaced_and_never_published",
        true,
    );
}

#[test]
fn paused_fake_pid_writer_is_replaced_and_never_published() {
    stopped_writer_is_replaced_and_never_published(
        "paused_fake_pid_writer_is_replaced_and_never_published",
        false,
    );
}
