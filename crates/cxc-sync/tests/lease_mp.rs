//! Multi-process tests of [`OwnerLease`] with real child processes (`docs/design.md` §3, L1–L6).
//!
//! Each test re-executes this test binary as child processes in a role (`cxc_testkit`'s
//! `RoleCommand`, role arguments `path`, `aux`, `grace`, `n`); a test function that finds
//! itself in a role plays it and exits instead of running the parent side. Children are killed
//! with SIGKILL, paused with SIGSTOP/SIGCONT, and parent and children synchronise through
//! the lease file itself (owner, generation, counters) or small marker files, never through
//! sleeps alone.
//!
//! Pids: a claim names the identity of the process that made it, whatever pid it was made
//! for (`docs/owner-lease.md`, Identity): its death is seen at once (identity path). While
//! that process lives, a claim fails over only when its heartbeat is more than `grace`
//! epochs old (heartbeat path) — the case of a claim the parent makes for a fake pid.
//! Fake pids are above `PID_MAX_LIMIT` (2^22), so they never name a real process.

mod ctl;

use std::ffi::OsStr;
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cxc_sync::lease::counter;
use cxc_sync::liveness::{ProcStatus, proc_status};
use cxc_sync::{LeaseOptions, OwnerLease, Preemption};
use cxc_testkit::{Proc, Rng, RoleCommand, arg, fields, path_arg, report, wait_for_path};

// ---------------------------------------------------------------------------------------
// Child-process plumbing (cxc_testkit)
// ---------------------------------------------------------------------------------------

/// Fake pids for children: above `PID_MAX_LIMIT` (4 194 304), never a real process.
const FAKE_CHILD_BASE: u32 = 10_000_000;
/// Fake pids for the parent: lower than every child's fake pid, so under
/// [`Preemption::LowerPid`] the parent would preempt at once.
const FAKE_PARENT_BASE: u32 = 5_000_000;

/// How long a child waits for its parent before giving up (the parent has failed then).
const CHILD_PATIENCE: Duration = Duration::from_secs(20);
/// How long the parent waits for a child to do what it awaits.
const PATIENCE: Duration = Duration::from_secs(5);

/// If this process is a child, play its role and exit; otherwise return.
fn child_dispatch() {
    cxc_testkit::play_role!(
        role_beater,
        role_holder,
        role_writer,
        role_hammer,
        role_paused,
        role_closure,
        role_prober
    );
}

/// Starts this test binary as child `role` of test `test`, with role arguments `args`.
fn spawn(test: &str, role: &str, args: &[(&str, &dyn AsRef<OsStr>)]) -> Proc {
    args.iter()
        .fold(RoleCommand::new(test, role), |cmd, (k, v)| cmd.arg(k, v))
        .spawn()
}

/// Role argument `key` as a number.
fn arg_u64(key: &str) -> u64 {
    arg(key)
        .parse()
        .unwrap_or_else(|_| panic!("role argument {key} is not a number"))
}

/// The value of `key` in a `key=value` report, parsed.
fn report_field<T: FromStr<Err: Debug>>(text: &str, key: &str) -> T {
    fields(text)
        .get(key)
        .unwrap_or_else(|| panic!("report {text:?} has no {key}"))
        .parse()
        .expect("report value")
}

/// Waits (in a child) until `path` exists; exits with code 4 if the parent never creates it.
fn child_wait_for_file(path: &Path) {
    if !wait_for_path(path, CHILD_PATIENCE) {
        std::process::exit(4);
    }
}

/// Waits for the child to exit with status 0 and returns its one report.
fn finish_report(kid: &mut Proc, timeout: Duration) -> String {
    let reports = kid.finish(timeout);
    assert_eq!(reports.len(), 1, "one report expected: {reports:?}");
    reports.into_iter().next().expect("one report")
}

fn never() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    }
}

// ---------------------------------------------------------------------------------------
// 1. Heartbeat failover
// ---------------------------------------------------------------------------------------

/// A new lease file `name` in a fresh directory holding `value`, with [`never`]'s
/// options: the directory (removed when dropped), the file's path, the lease.
fn new_lease<T>(name: &str, value: T) -> (tempfile::TempDir, PathBuf, OwnerLease<T>)
where
    T: zerocopy::FromBytes + zerocopy::IntoBytes + zerocopy::Immutable + zerocopy::KnownLayout,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    let lease = OwnerLease::create_with(&path, value, &never()).expect("create");
    (dir, path, lease)
}

/// Child: claims with a fake pid and beats about every millisecond.
fn role_beater() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).expect("open lease");
    let grace = arg_u64("grace");
    let fake = FAKE_CHILD_BASE + std::process::id();
    let claim = lease.try_claim(fake, grace).expect("lease is vacant");
    let mut i = 0u64;
    loop {
        i += 1;
        // Both beat flavours; a refused beat means the lease was lost while alive.
        let ok = if i.is_multiple_of(2) {
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
    let (_dir, path, lease) = new_lease::<u64>("hb.lease", 0);
    let mut kid = spawn(
        "standby_takes_over_after_sigstop_heartbeat_path",
        "beater",
        &[("path", &path), ("grace", &GRACE.to_string())],
    );
    let child_fake = FAKE_CHILD_BASE + kid.pid();
    let me = FAKE_PARENT_BASE + std::process::id();
    assert!(me < child_fake);
    kid.wait_while_alive("child holds the lease", PATIENCE, || {
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
    assert!(kid.try_wait().is_none(), "child lost the lease while alive");
    let st = lease.status();
    assert_eq!(st.owner, Some(child_fake));
    assert!(
        st.heartbeat_epoch > hb_before + GRACE,
        "the child's beats did not move the heartbeat: {st:?}"
    );

    // SIGSTOP: after this no beat can land, and the OS still says the holder lives.
    kid.stop();
    kid.wait_state('T', PATIENCE);
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
    kid.kill();
}

// ---------------------------------------------------------------------------------------
// 2. OS-identity failover
// ---------------------------------------------------------------------------------------

const NO_STALENESS: u64 = u64::MAX / 2;

/// Child: claims with its real pid and never beats.
fn role_holder() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).expect("open lease");
    let _claim = lease
        .try_claim(std::process::id(), NO_STALENESS)
        .expect("lease is vacant");
    loop {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// After `how` took the lease over from the SIGKILLed `kid`, `latency` after the kill:
/// the holder was not reaped (its pid is not reused); it may still be exiting (a takeover
/// through its sentinel comes before its exit ends) but must be a zombie soon, which shows
/// the takeover was of a dying process; reaps it and checks the takeover took under a
/// second.
fn took_over_from_zombie(kid: &mut Proc, how: &str, latency: Duration) {
    let t = std::time::Instant::now();
    while proc_status(kid.pid()) != ProcStatus::Zombie {
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the holder taken over is not dying: {:?}",
            proc_status(kid.pid())
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    kid.kill();
    println!("identity path: {how} took over {latency:?} after SIGKILL");
    assert!(
        latency < Duration::from_secs(1),
        "takeover took {latency:?} after SIGKILL"
    );
}

/// L5 (identity): a holder that claimed with its own pid is replaced at once when it is
/// SIGKILLed, while still an unreaped zombie, both by a blocked `acquire` (woken from its
/// futex sleep by the periodic pidfd check) and by polling `try_claim`. Staleness can
/// never trigger (grace = u64::MAX/2, no ticks) and preemption is off, so only the OS
/// identity can explain the takeover. Before the kill, neither path takes the live holder.
#[test]
fn standby_takes_over_after_sigkill_identity_path() {
    child_dispatch();
    let (_dir, path, lease) = new_lease::<u64>("id.lease", 0);
    let me = std::process::id();
    let spawn_holder = |lease: &OwnerLease<u64>| {
        let mut kid = spawn(
            "standby_takes_over_after_sigkill_identity_path",
            "holder",
            &[("path", &path)],
        );
        let pid = kid.pid();
        kid.wait_while_alive(
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
        kid.wait_while_alive("acquirer is blocked", PATIENCE, || {
            lease.status().counters[counter::BLOCKED_WAITS] > waits_before
        });
        let killed_at = Instant::now();
        kid.kill_unreaped();
        let (c, got_at) = waiter.join().expect("acquirer thread");
        (c, got_at.saturating_duration_since(killed_at))
    });
    let claim = claim.expect("blocked acquire did not take over from the killed holder");
    took_over_from_zombie(&mut kid, "blocked acquire", latency);
    assert_eq!(claim.generation(), gen1 + 1);
    assert!(lease.release_claim(&claim));

    // Round 2: polling `try_claim`.
    let mut kid = spawn_holder(&lease);
    let gen2 = lease.lease_term();
    assert!(lease.try_claim(me, NO_STALENESS).is_none());
    let killed_at = Instant::now();
    kid.kill_unreaped();
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
    took_over_from_zombie(&mut kid, "polling try_claim", killed_at.elapsed());
    assert_eq!(claim.generation(), gen2 + 1);
    // Taken over through the holder's sentinel (its process was exiting) or the OS's
    // proof of its death, whichever the waiter saw first; never by staleness.
    let c = lease.status().counters;
    assert_eq!(
        c[counter::CLAIM_DEAD] + c[counter::CLAIM_EXITING],
        2,
        "{c:?}"
    );
    assert_eq!(c[counter::CLAIM_STALE], 0);
}

/// This process's threads named like the lease's death watchers.
fn watcher_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim() == "cxc-lease-watch")
        .count()
}

/// Child (in a process of its own, so no other test's threads are counted): on the lease
/// that process `holder` holds, a blocked `acquire` times out (its death watcher still
/// watching), then another one blocks until a death watcher runs, SIGKILLs the holder and
/// takes over. Right after each handle drops, no watcher thread runs: the waiter only told
/// its watcher to stop, and the handle joins it (without that join the timed-out wait's
/// watcher is usually still exiting at that point).
fn role_prober() {
    let path = path_arg("path");
    let holder = arg_u64("holder") as i32;
    let me = std::process::id();
    // A wait that times out: the handle keeps its watcher (still watching the live
    // holder), and stops and joins it when it drops.
    let lease = OwnerLease::<u64>::open(&path).expect("open lease");
    assert!(
        lease
            .acquire(me, NO_STALENESS, Duration::from_millis(50))
            .is_none()
    );
    assert_eq!(watcher_threads(), 1, "the timed-out wait's watcher is kept");
    // No wait uses it: it ends by itself after about a second, the handle still open.
    let t = Instant::now();
    while watcher_threads() != 0 {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "an unused watcher never ended"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        t.elapsed() >= Duration::from_millis(500),
        "the kept watcher ended at once ({:?})",
        t.elapsed()
    );
    assert!(
        lease
            .acquire(me, NO_STALENESS, Duration::from_millis(50))
            .is_none()
    );
    assert_eq!(watcher_threads(), 1, "a later wait starts a new one");
    drop(lease);
    assert_eq!(
        watcher_threads(),
        0,
        "a timed-out wait's watcher outlived its handle"
    );
    let lease = OwnerLease::<u64>::open(&path).expect("open lease");
    // Two waits on the same holder process share one watcher.
    for _ in 0..2 {
        assert!(
            lease
                .acquire(me, NO_STALENESS, Duration::from_millis(50))
                .is_none()
        );
        assert_eq!(watcher_threads(), 1, "one watcher per handle and holder");
    }
    let claim = std::thread::scope(|s| {
        let waiter = s.spawn(|| lease.acquire(me, NO_STALENESS, CHILD_PATIENCE));
        // The kept watcher covers this wait from its first sleep.
        std::thread::sleep(Duration::from_millis(5));
        let pid = rustix::process::Pid::from_raw(holder).expect("holder pid");
        let killed = Instant::now();
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill holder");
        let claim = waiter.join().expect("acquirer thread");
        (claim, killed.elapsed())
    });
    let (claim, took) = claim;
    let claim = claim.expect("the blocked acquire took over from the killed holder");
    assert!(lease.release_claim(&claim));
    drop(lease);
    assert_eq!(watcher_threads(), 0, "a death watcher outlived its handle");
    report(format!("ok=1 takeover_us={}", took.as_micros()));
}

/// A blocked `acquire` woken by its death watcher returns without stopping or joining
/// the watcher thread; the handle keeps it for later waits on the same holder process
/// (one thread, not one per wait), the thread ends by itself after a second unused, and
/// the handle stops and joins it at the latest when it drops (the thread reads the
/// handle's mapping, so it must not outlive it). Runs in a child process
/// of its own.
#[test]
fn death_watchers_end_with_their_handle() {
    child_dispatch();
    let (_dir, path, lease) = new_lease::<u64>("watch.lease", 0);
    let test = "death_watchers_end_with_their_handle";
    let mut holder = spawn(test, "holder", &[("path", &path)]);
    let pid = holder.pid();
    holder.wait_while_alive("child holds the lease", PATIENCE, || {
        lease.status().owner == Some(pid)
    });
    let mut prober = spawn(
        test,
        "prober",
        &[("path", &path), ("holder", &pid.to_string())],
    );
    let line = finish_report(&mut prober, Duration::from_secs(30));
    assert_eq!(report_field::<u32>(&line, "ok"), 1, "{line}");
    holder.kill();
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
    let lease = OwnerLease::<Words>::open(path_arg("path")).expect("open lease");
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
        if i.is_multiple_of(512) {
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
        } else if i.is_multiple_of(64) {
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
    let (_dir, path, lease) = new_lease::<Words>("torn.lease", payload(0));
    let me = std::process::id();
    let mut rng = Rng::for_test();
    let seed = rng.seed();
    let mut last_seq = 0u64;
    let mut torn_rounds = 0usize;
    let mut progressed = 0usize;
    let mut no_identity = 0usize;
    for round in 0..ROUNDS {
        let mut kid = spawn(
            "writer_killed_mid_write_never_exposes_torn_payload",
            "writer",
            &[("path", &path)],
        );
        let pid = kid.pid();
        kid.wait_while_alive("child holds the lease", PATIENCE, || {
            lease.current_owner() == Some(pid)
        });
        std::thread::sleep(Duration::from_millis(rng.range(1, 31)));
        if let Some(s) = kid.try_wait() {
            panic!("round {round}: writer exited early ({s}); seed {seed:#x}");
        }
        kid.kill_unreaped();
        // Dead for certain (a zombie, not reaped) before anyone takes over.
        kid.wait_state('Z', PATIENCE);
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
        kid.kill();
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

const HAMMER_GRACE: u64 = 1_000;

/// Child: performs `N` successful increments, alternating `with_lease` and
/// `try_claim` + `read_claimed` + `write_claimed` + `release_claim`.
fn role_hammer() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).expect("open lease");
    let ctl = ctl::open(&path_arg("aux"));
    let n = arg_u64("n");
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
    report(format!(
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
    let ctl = ctl::create(&ctl_path);
    let c = ctl.head();
    let n = N.to_string();
    let mut kids = Vec::new();
    for k in 0..2 {
        let mut kid = spawn(
            TEST,
            "hammer",
            &[("path", &path), ("aux", &ctl_path), ("n", &n)],
        );
        kid.wait_while_alive("child ready", PATIENCE, || {
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
    let texts: Vec<String> = kids
        .iter_mut()
        .map(|kid| finish_report(kid, Duration::from_secs(8)))
        .collect();
    let elapsed = t0.elapsed();
    let mut total = 0;
    for (kid, text) in kids.iter().zip(&texts) {
        let (with, claimed): (u64, u64) =
            (report_field(text, "with"), report_field(text, "claimed"));
        println!("child {}: {text}", kid.pid());
        assert_eq!(with + claimed, N);
        assert!(
            with > 0 && claimed > 0,
            "both update paths must be exercised: {text}"
        );
        assert_eq!(report_field::<u64>(text, "violations"), 0);
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
        (
            st.counters[counter::CLAIM_DEAD],
            st.counters[counter::CLAIM_EXITING]
        ),
        (0, 0),
        "a live child was taken as dead or exiting"
    );
    assert_eq!(st.counters[counter::CLAIM_STALE], 0);
}

// ---------------------------------------------------------------------------------------
// 5. Paused owner is fenced
// ---------------------------------------------------------------------------------------

const PAUSE_GRACE: u64 = 10;

/// Ticks the epoch past `PAUSE_GRACE` epochs after heartbeat `hb`, checking at every
/// tick within the grace that `me` cannot take the lease over.
fn tick_through_grace(lease: &OwnerLease<u64>, me: u32, hb: u64) {
    while lease.current_epoch() < hb + PAUSE_GRACE {
        lease.tick_epoch();
        assert!(
            lease.try_claim(me, PAUSE_GRACE).is_none(),
            "took over within grace"
        );
    }
    lease.tick_epoch();
}

/// Child: claims with a fake pid, writes 111, creates the marker file, waits for the go
/// file, then tries every owner operation with its old claim and reports the results.
fn role_paused() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).expect("open lease");
    let aux = path_arg("aux");
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
    report(format!(
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
    let (dir, path, lease) = new_lease::<u64>("paused.lease", 0);
    let aux = dir.path().join("sig");
    let mut kid = spawn(
        "paused_owner_write_rejected_after_takeover",
        "paused",
        &[("path", &path), ("aux", &aux)],
    );
    let fake = FAKE_CHILD_BASE + kid.pid();
    kid.wait_while_alive(
        "child holds the lease and wrote",
        Duration::from_secs(5),
        || lease.current_owner() == Some(fake) && aux.with_extension("held").exists(),
    );
    kid.stop();
    kid.wait_state('T', PATIENCE);
    let old_gen = lease.lease_term();
    let me = std::process::id();
    tick_through_grace(&lease, me, lease.status().heartbeat_epoch);
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
    kid.cont();
    let text = finish_report(&mut kid, PATIENCE);
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
            !report_field::<bool>(&text, key),
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

/// Child: runs `with_lease` (real or fake pid, per role argument `n`: 1 = real) whose closure
/// creates the marker file, waits for the go file and stores 0xBAD; reports whether
/// `with_lease` published.
fn role_closure() {
    let lease = OwnerLease::<u64>::open(path_arg("path")).expect("open lease");
    let aux = path_arg("aux");
    let pid = if arg_u64("n") == 1 {
        std::process::id()
    } else {
        FAKE_CHILD_BASE + std::process::id()
    };
    let r = lease.with_lease(pid, PAUSE_GRACE, |v| {
        std::fs::write(aux.with_extension("inside"), b"").expect("marker");
        child_wait_for_file(&aux.with_extension("go"));
        *v = 0xBAD;
    });
    report(format!("published={}", r.is_some()));
}

/// Starts a `role_closure` child and waits until it is stopped inside its closure.
fn stopped_in_closure(test: &str, path: &Path, aux: &Path, real_pid: bool) -> Proc {
    let mode = if real_pid { "1" } else { "0" };
    let mut kid = spawn(
        test,
        "closure",
        &[("path", &path), ("aux", &aux), ("n", &mode)],
    );
    kid.wait_while_alive("child inside its closure", PATIENCE, || {
        aux.with_extension("inside").exists()
    });
    kid.stop();
    kid.wait_state('T', PATIENCE);
    kid
}

/// L5 + L7: a live holder stopped (SIGSTOP) in the middle of a `with_lease` closure is
/// replaced once its heartbeat is older than the grace; the new holder is told the payload
/// may be inconsistent, reads the last published value and writes its own. When the old
/// holder is continued, its closure's update is never published, its staging buffer
/// leaves quarantine, and the new holder's value stays.
fn stopped_writer_is_replaced_and_never_published(test: &str, real_pid: bool) {
    child_dispatch();
    let (dir, path, lease) = new_lease::<u64>("mid.lease", 1);
    let aux = dir.path().join("sig");
    let mut kid = stopped_in_closure(test, &path, &aux, real_pid);
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
    tick_through_grace(&lease, me, st.heartbeat_epoch);
    let mine = lease
        .acquire(me, PAUSE_GRACE, Duration::from_secs(2))
        .expect("a stopped writer is replaced after the grace");
    assert!(mine.payload_may_be_inconsistent());
    assert_eq!(lease.read_claimed(&mine), Some(1));
    assert!(lease.write_claimed(&mine, 222));
    assert_eq!(lease.status().counters[counter::QUARANTINED], 1);
    std::fs::write(aux.with_extension("go"), b"").expect("go file");
    kid.cont();
    let text = finish_report(&mut kid, PATIENCE);
    assert!(!report_field::<bool>(&text, "published"), "{text}");
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
