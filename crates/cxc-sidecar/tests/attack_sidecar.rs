//! Attacks on the sidecar (docs/sidecar.md): garbage strategy words and garbage ring
//! words stored into a live file by another process, producers SIGKILLed and SIGSTOPped
//! in the middle of recording, boxes dropped while the background thread polls them, and
//! two processes running different policies on one file.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Probe, private_sidecar};
use cxc_mmf::{Expect, Kind, Mapped, TypeFingerprint};
use cxc_sidecar::{
    AdaptiveInstance, AdaptiveSpin, Observation, OpCode, SidecarBox, Stats, Strategy, flags,
};
use cxc_testkit::{Rng, RoleCommand, path_arg, play_role, report, wait_until};
use zerocopy::{FromBytes, KnownLayout};

/// Words of the probe's fixed block (`common::ProbeState`: 16 counters, the handshake, the
/// ring), mapped as plain words: how a hostile or buggy process sees the file.
const WORDS: usize = common::HEAD_SIZE as usize / 8;
/// The strategy word.
const W_STRATEGY: usize = 16;
/// The ring's `head`, `dropped`, and its first slot.
const W_HEAD: usize = 24;
const W_DROPPED: usize = 25;
const W_SLOTS: usize = 32;
/// Counters the tests use for hand-shakes between processes.
const C_READY: usize = 8;
const C_GO: usize = 9;
const C_STOP: usize = 10;

cxc_mmf::atomic_layout! {
    /// The probe's fixed block as raw words.
    #[derive(FromBytes, KnownLayout)]
    #[repr(C, align(64))]
    pub struct RawWords {
        /// Every word of the block.
        pub w: [AtomicU64; WORDS],
    }
}

fn open_raw(path: &Path) -> Mapped<RawWords> {
    let expect = Expect {
        kind: Kind::Test,
        head_size: common::HEAD_SIZE,
        slot_size: 0,
        capacity: Some(0),
        max_capacity: 0,
        payload: TypeFingerprint::NONE,
        check_params: &|_| Ok(()),
    };
    Mapped::open(path, &expect).expect("open the probe file as raw words")
}

/// A word biased to the values that break decoders.
fn hostile_word(rng: &mut Rng) -> u64 {
    let r = rng.next_u64();
    match r % 8 {
        0 => u64::MAX,
        1 => 0,
        2 => (2u64 << 32) | (u64::from(Strategy::MAX_PARAM) << 40) | (r & 0xFFFF_FFFF),
        3 => (2u64 << 32) | (r & !0xFF_0000_0000),
        4 => (r & 0xFFFF_FFFF) | (1u64 << 32) | ((r >> 7) << 40),
        5 => r << 63,
        _ => rng.next_u64(),
    }
}

fn role_strategy_vandal() {
    let raw = open_raw(&path_arg("path"));
    let mut rng = Rng::new(0xBAD5_7A7E);
    let w = &raw.head().w;
    w[C_READY].store(1, Ordering::Release);
    while w[C_STOP].load(Ordering::Acquire) == 0 {
        w[W_STRATEGY].store(hostile_word(&mut rng), Ordering::Relaxed);
    }
    // Leave the worst budget the word can hold, under an unknown-looking generation.
    w[W_STRATEGY].store(
        (2u64 << 32) | (u64::from(Strategy::MAX_PARAM) << 40) | 0xFFFF_FFFF,
        Ordering::Release,
    );
    report("done=1");
}

/// Another process stores garbage strategy words into the live file as fast as it can.
/// Every read in this process decodes to a spin budget of at most 2^24 − 1 ns ("at most
/// 2^24 − 1 ≈ 16.7 ms"), unknown tags read as the primitive default ("Unknown tags read
/// as `Strategy::Unknown` and primitives treat them as `Default`"), a sidecar with
/// `AdaptiveSpin` keeps polling, and once the vandal stops — leaving the largest budget
/// and generation u32::MAX — short waits bring the file back to a budget of at most 50 µs
/// ("clamped to 1–50 µs") with a generation that wrapped past 0 to a non-zero one.
#[test]
fn garbage_strategy_words_are_clamped_and_the_policy_recovers() {
    play_role!(role_strategy_vandal);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hs.probe");
    let sc = private_sidecar();
    let probe = SidecarBox::new_in(
        sc,
        Probe::create(&path),
        Some(Box::new(AdaptiveSpin::new())),
    );
    let mut vandal = RoleCommand::new(
        "garbage_strategy_words_are_clamped_and_the_policy_recovers",
        "strategy_vandal",
    )
    .arg("path", &path)
    .spawn();
    assert!(
        wait_until(Duration::from_secs(20), || probe.state().counters[C_READY]
            .load(Ordering::Acquire)
            == 1),
        "vandal did not start"
    );
    let max = Duration::from_nanos(u64::from(Strategy::MAX_PARAM));
    let started = Instant::now();
    let (mut reads, mut unknown, mut spins) = (0u64, 0u64, 0u64);
    while started.elapsed() < Duration::from_millis(800) {
        let hs = probe.handshake();
        let (s, _) = hs.current();
        match s {
            Strategy::Spin { budget_ns } => {
                spins += 1;
                assert!(budget_ns <= Strategy::MAX_PARAM, "{s:?}");
            }
            Strategy::Unknown { .. } => {
                unknown += 1;
                assert_eq!(s.spin_budget(), None, "{s:?} must read as the default");
            }
            _ => {}
        }
        if let Some(b) = hs.spin_budget() {
            assert!(b <= max, "spin budget {b:?} over the clamp");
        }
        // Waits the policy sees, and polls that may apply while the vandal writes.
        probe.wait(2_000, flags::WAIT_SPUN);
        if reads % 16 == 0 {
            sc.poll();
        }
        reads += 1;
    }
    probe.state().counters[C_STOP].store(1, Ordering::Release);
    let reports = vandal.finish(Duration::from_secs(20));
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert!(
        spins > 0 && unknown > 0,
        "the vandal's words were not seen: {spins} {unknown}"
    );
    // Left by the vandal: the largest budget, generation u32::MAX.
    assert_eq!(
        probe.handshake().current(),
        (
            Strategy::Spin {
                budget_ns: Strategy::MAX_PARAM
            },
            u32::MAX
        )
    );
    // Short waits: AdaptiveSpin must bring the file back to a sane budget.
    for _ in 0..20 {
        for _ in 0..40 {
            probe.wait(2_000, flags::WAIT_SPUN);
        }
        sc.poll();
    }
    let (s, g) = probe.handshake().current();
    match s {
        Strategy::Spin { budget_ns } => assert!(
            (1_000..=50_000).contains(&budget_ns),
            "AdaptiveSpin left {s:?} after short waits"
        ),
        other => panic!("AdaptiveSpin left {other:?} after 800 waits of 2 µs"),
    }
    assert_ne!(g, 0, "generation 0 means never published");
    assert!(probe.stats().policy_panics == 0, "{:?}", probe.stats());
}

fn role_ring_vandal() {
    let raw = open_raw(&path_arg("path"));
    let mut rng = Rng::new(0x0005_1DEC_A125);
    let w = &raw.head().w;
    w[C_READY].store(1, Ordering::Release);
    let mut stores = 0u64;
    while w[C_STOP].load(Ordering::Acquire) == 0 {
        let i = match rng.next_u64() % 10 {
            0 => W_HEAD,
            1 => W_DROPPED,
            _ => W_SLOTS + (rng.next_u64() % 320) as usize,
        };
        let v = match rng.next_u64() % 4 {
            // A plausible sequence word near the head: published or writing.
            0 => w[W_HEAD]
                .load(Ordering::Relaxed)
                .wrapping_sub(rng.next_u64() % 200)
                .wrapping_mul(2)
                .wrapping_add(1 + rng.next_u64() % 2),
            1 => w[W_HEAD]
                .load(Ordering::Relaxed)
                .wrapping_add(rng.next_u64() % 200),
            _ => hostile_word(&mut rng),
        };
        w[i].store(v, Ordering::Relaxed);
        stores += 1;
    }
    report(format_args!("stores={stores}"));
}

/// The 16-bit tag a producer of this test puts in `flags`: a hash of the argument.
fn tag(arg: u64) -> u16 {
    (arg.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) as u16
}

/// Another process stores garbage into the ring (head, dropped, sequence words, fields)
/// while this process records and reads it. Docs: a reader "never returns a torn one",
/// "a corrupt file can make a reader return nothing but cannot make it touch memory
/// outside the ring", "every `seq`/`head` value is handled with wrapping arithmetic (never
/// a panic)", readers "wait a bounded time". Every returned entry must be one this
/// process recorded (its op, pid, tag), in ticket order; each call returns quickly.
#[test]
fn ring_garbage_from_another_process_never_yields_a_forged_entry() {
    play_role!(role_ring_vandal);
    const CODE: u16 = 0x7A11;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring.probe");
    let probe = Probe::create(&path);
    let mut vandal = RoleCommand::new(
        "ring_garbage_from_another_process_never_yields_a_forged_entry",
        "ring_vandal",
    )
    .arg("path", &path)
    .spawn();
    assert!(
        wait_until(Duration::from_secs(20), || probe.state().counters[C_READY]
            .load(Ordering::Acquire)
            == 1),
        "vandal did not start"
    );
    let me = std::process::id();
    let ring = probe.ring();
    let mut rng = Rng::new(7);
    let mut recorded = std::collections::HashSet::new();
    let (mut returned, mut calls, mut slowest) = (0u64, 0u64, Duration::ZERO);
    let mut cursor = 0u64;
    let started = Instant::now();
    // At least 1.5 s and 40 reads, at most 6 s (reads are slow on a busy machine: see
    // `a_read_over_tickets_of_dead_producers_is_brief_on_a_busy_machine`).
    while (started.elapsed() < Duration::from_millis(1500) || calls < 40)
        && started.elapsed() < Duration::from_secs(6)
    {
        for _ in 0..8 {
            let arg = rng.next_u64();
            recorded.insert(arg);
            ring.record_code(CODE, tag(arg), arg);
        }
        let t = Instant::now();
        let batch = if calls % 3 == 0 {
            let obs = ring.snapshot();
            (obs, None)
        } else {
            let b = ring.read_since(cursor);
            (b.observations.clone(), Some(b))
        };
        let took = t.elapsed();
        slowest = slowest.max(took);
        calls += 1;
        let (obs, b) = batch;
        if let Some(b) = b {
            if cursor < b.next {
                assert_eq!(
                    obs.len() as u64 + b.lost,
                    b.next - cursor,
                    "len + lost != next - cursor ({cursor} -> {})",
                    b.next
                );
                assert!(b.rejected <= b.lost);
                for o in &obs {
                    assert!(
                        (cursor..b.next).contains(&o.ticket),
                        "{o} outside {cursor}..{}",
                        b.next
                    );
                }
            }
            cursor = b.next;
        }
        for pair in obs.windows(2) {
            assert!(
                pair[0].ticket < pair[1].ticket,
                "not in ticket order: {} {}",
                pair[0],
                pair[1]
            );
        }
        for o in &obs {
            assert!(
                o.op == OpCode::Unknown(CODE)
                    && o.pid == me
                    && o.flags == tag(o.arg)
                    && recorded.contains(&o.arg),
                "forged or torn entry returned as valid: {o}"
            );
        }
        returned += obs.len() as u64;
    }
    probe.state().counters[C_STOP].store(1, Ordering::Release);
    let reports = vandal.finish(Duration::from_secs(20));
    assert_eq!(reports.len(), 1, "{reports:?}");
    // A hang detector only (how long a read may take on a busy machine is the subject
    // of `a_read_over_tickets_of_dead_producers_is_brief_on_a_busy_machine`).
    assert!(
        slowest < Duration::from_secs(3),
        "a read of a garbage ring took {slowest:?}"
    );
    assert!(calls >= 5, "only {calls} reads");
    // Not an assertion about garbage: just that the reader returned something at all.
    assert!(
        returned > 0,
        "no intact entry ever returned in {calls} reads"
    );
}

/// A producer process: records `(index << 40 | i)` entries with the index's tag as fast
/// as it can, counting them in counter `index`, until told to stop.
fn role_producer() {
    let probe = Probe::open(&path_arg("path"));
    let index: u64 = cxc_testkit::arg("index").parse().unwrap();
    probe.state().counters[C_READY].fetch_add(1, Ordering::AcqRel);
    let mut i = 0u64;
    while probe.state().counters[C_STOP].load(Ordering::Acquire) == 0 {
        let arg = index << 40 | i;
        probe
            .state()
            .ring
            .record_code(0x7B00 | index as u16, tag(arg), arg);
        probe.state().counters[index as usize].fetch_add(1, Ordering::Relaxed);
        i += 1;
    }
    report(format_args!("recorded={i}"));
}

/// Four processes record into one ring at full speed; one is SIGKILLed and one
/// SIGSTOPped (both most likely in the middle of an entry: recording is all they do),
/// the stopped one resumed after the ring lapped it many times. Docs: "producers never
/// wait (they claim or drop); readers wait a bounded time for an unfinished slot, then
/// skip it; the next lap's producer takes over a slot left odd by a dead producer";
/// `observations.len() + lost == next - cursor`; no torn entry is returned. At the end,
/// with the killed producer's slots left behind, 64 fresh entries must all come back.
#[test]
fn producers_killed_and_stopped_mid_record_never_hang_or_corrupt_readers() {
    play_role!(role_producer);
    const TEST: &str = "producers_killed_and_stopped_mid_record_never_hang_or_corrupt_readers";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kill.probe");
    let probe = Probe::create(&path);
    let mut kids: Vec<_> = (1..=4u64)
        .map(|i| {
            RoleCommand::new(TEST, "producer")
                .arg("path", &path)
                .arg("index", i.to_string())
                .spawn()
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(20), || probe.state().counters[C_READY]
            .load(Ordering::Acquire)
            == 4),
        "producers did not start"
    );
    let pids: HashMap<u32, u64> = kids.iter().zip(1..).map(|(k, i)| (k.pid(), i)).collect();
    let ring = probe.ring();
    let mut cursor = 0u64;
    let (mut seen, mut lost, mut slowest) = (0u64, 0u64, Duration::ZERO);
    let mut last: HashMap<u64, u64> = HashMap::new();
    let mut drain = |cursor: &mut u64, seen: &mut u64, lost: &mut u64| {
        let t = Instant::now();
        let b = ring.read_since(*cursor);
        slowest = slowest.max(t.elapsed());
        assert_eq!(b.observations.len() as u64 + b.lost, b.next - *cursor);
        for o in &b.observations {
            let idx = o.arg >> 40;
            assert_eq!(o.flags, tag(o.arg), "torn entry returned: {o}");
            assert_eq!(o.op.code(), 0x7B00 | idx as u16, "{o}");
            assert_eq!(
                pids.get(&o.pid),
                Some(&idx),
                "entry of {idx} with pid {}: {o}",
                o.pid
            );
            let n = o.arg & ((1 << 40) - 1);
            if let Some(prev) = last.insert(idx, n) {
                assert!(prev < n, "producer {idx} out of order: {prev} then {n}");
            }
        }
        *seen += b.observations.len() as u64;
        *lost += b.lost;
        *cursor = b.next;
    };
    let phase = |ms: u64,
                 cursor: &mut u64,
                 seen: &mut u64,
                 lost: &mut u64,
                 drain: &mut dyn FnMut(&mut u64, &mut u64, &mut u64)| {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            drain(cursor, seen, lost);
        }
    };
    phase(300, &mut cursor, &mut seen, &mut lost, &mut drain);
    kids[0].stop();
    kids[1].kill_unreaped();
    phase(600, &mut cursor, &mut seen, &mut lost, &mut drain);
    kids[0].cont();
    phase(300, &mut cursor, &mut seen, &mut lost, &mut drain);
    probe.state().counters[C_STOP].store(1, Ordering::Release);
    for (i, k) in kids.iter_mut().enumerate() {
        if i == 1 {
            k.kill();
        } else {
            let r = k.finish(Duration::from_secs(20));
            assert_eq!(r.len(), 1, "{r:?}");
        }
    }
    drain(&mut cursor, &mut seen, &mut lost);
    assert_eq!(
        seen + lost,
        ring.head(),
        "every position returned or lost once"
    );
    assert!(seen > 1000, "only {seen} entries seen");
    assert!(
        slowest < Duration::from_millis(200),
        "a read took {slowest:?} with a producer stopped or killed mid-entry"
    );
    // The next lap takes over whatever the killed and stopped producers left.
    for i in 0..64u64 {
        let arg = 7 << 40 | i;
        ring.record_code(0x7B07, tag(arg), arg);
    }
    let snap = ring.snapshot();
    assert_eq!(
        snap.iter().filter(|o| o.op.code() == 0x7B07).count(),
        64,
        "fresh entries not all readable after a producer died mid-entry (dropped {})",
        ring.dropped()
    );
}

/// Boxes created and dropped by several threads while the sidecar's background thread
/// polls every millisecond, with policies that take a while. Docs: dropping a box
/// "unregisters it without waiting for a poll in progress ... if a poll is processing it
/// at that moment, the primitive itself is dropped when that poll finishes"; the thread
/// stops promptly when its handle is dropped. Every instance must be dropped soon after
/// its box, never reported after, and the registry empty at the end.
#[test]
fn boxes_dropped_while_the_background_thread_polls_are_released() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let sc = private_sidecar();
    let thread = sc.spawn(Duration::from_millis(1)).unwrap();
    let slow_releases = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for t in 0..4 {
            let (dir, slow) = (dir.clone(), slow_releases.clone());
            s.spawn(move || {
                for i in 0..60 {
                    let flag = Arc::new(AtomicBool::new(false));
                    let probe = Probe::create(&dir.path().join(format!("p{t}.{i}")))
                        .with_drop_flag(flag.clone());
                    let policy = move |obs: &[Observation], _: &Stats| {
                        std::thread::sleep(Duration::from_micros(300));
                        (obs.len() > 2).then_some(Strategy::Park)
                    };
                    let b = SidecarBox::new_in(sc, probe, Some(Box::new(policy)));
                    for k in 0..(i % 5) {
                        b.wait(1_000 * k, flags::WAIT_PARKED);
                    }
                    std::thread::sleep(Duration::from_micros(200 * (i % 4)));
                    let id = b.id();
                    drop(b);
                    let t0 = Instant::now();
                    if !wait_until(Duration::from_secs(2), || flag.load(Ordering::Acquire)) {
                        slow.fetch_add(1, Ordering::Relaxed);
                    }
                    assert!(t0.elapsed() < Duration::from_secs(3));
                    assert!(sc.stats(id).is_none(), "dropped box still registered");
                    assert!(sc.poll().get(id).is_none(), "dropped box still polled");
                }
            });
        }
    });
    assert_eq!(
        slow_releases.load(Ordering::Relaxed),
        0,
        "instances not dropped within 2 s of their box"
    );
    assert_eq!(sc.len(), 0);
    let t = Instant::now();
    drop(thread);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "thread stop took {:?}",
        t.elapsed()
    );
}

/// The strategy a `StrategyChanged` entry names (its argument is the strategy word).
fn strategy_of(word: u64) -> Strategy {
    Strategy::from_parts(((word >> 32) & 0xFF) as u8, (word >> 40) as u32)
}

/// Polls `probe`'s sidecar in a loop with the policy "always `want`" until counter
/// `C_STOP`; returns the `StrategyChanged` entries seen (pid, strategy named).
fn flip_loop(
    sc: &'static cxc_sidecar::Sidecar,
    probe: &SidecarBox<Probe>,
    id: cxc_sidecar::InstanceId,
) -> (Vec<(u32, Strategy)>, u64) {
    let mut seen = Vec::new();
    let mut polls = 0;
    while probe.state().counters[C_STOP].load(Ordering::Acquire) == 0 {
        if let Some(r) = sc.poll().get(id) {
            for o in &r.observations {
                if o.op == OpCode::StrategyChanged {
                    seen.push((o.pid, strategy_of(o.arg)));
                }
            }
        }
        polls += 1;
    }
    (seen, polls)
}

fn role_spinner() {
    let sc = private_sidecar();
    let want = Strategy::Spin { budget_ns: 4096 };
    let probe = SidecarBox::new_in(
        sc,
        Probe::open(&path_arg("path")),
        Some(Box::new(move |_: &[Observation], _: &Stats| Some(want))),
    );
    probe.state().counters[C_READY].fetch_add(1, Ordering::AcqRel);
    let _ = wait_until(Duration::from_secs(20), || {
        probe.state().counters[C_GO].load(Ordering::Acquire) == 1
    });
    let (_, polls) = flip_loop(sc, &probe, probe.id());
    report(format_args!(
        "polls={polls} changes={}",
        probe.stats().strategy_changes
    ));
}

// Found (fixed since): AdaptiveInstance::apply records `handshake().word()` re-read after publish, so when the other process publishes in between, the entry names the other process's strategy, not the one this process applied.
/// Two processes run different policies on one file (docs: "their decisions all land in
/// the one handshake word ... they overwrite each other"): one always wants `Park`, the
/// other `Spin { 4096 }`. Overwriting is documented; what each `StrategyChanged` entry
/// says is not up to the race: "a policy published a new strategy | the new strategy
/// word" — an entry recorded by a process must name the strategy that process published.
#[test]
fn two_processes_with_opposite_policies_record_what_they_published() {
    play_role!(role_spinner);
    const TEST: &str = "two_processes_with_opposite_policies_record_what_they_published";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.probe");
    let sc = private_sidecar();
    let probe = SidecarBox::new_in(
        sc,
        Probe::create(&path),
        Some(Box::new(|_: &[Observation], _: &Stats| {
            Some(Strategy::Park)
        })),
    );
    let mut child = RoleCommand::new(TEST, "spinner").arg("path", &path).spawn();
    assert!(
        wait_until(Duration::from_secs(20), || probe.state().counters[C_READY]
            .load(Ordering::Acquire)
            == 1),
        "spinner did not start"
    );
    let child_pid = child.pid();
    let me = std::process::id();
    probe.state().counters[C_GO].store(1, Ordering::Release);
    let stopper = {
        let raw = open_raw(&path);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            raw.head().w[C_STOP].store(1, Ordering::Release);
        })
    };
    let (seen, polls) = flip_loop(sc, &probe, probe.id());
    stopper.join().unwrap();
    let reports = child.finish(Duration::from_secs(20));
    assert_eq!(reports.len(), 1, "{reports:?}");
    let mine = seen.iter().filter(|(p, _)| *p == me).count();
    let theirs = seen.iter().filter(|(p, _)| *p == child_pid).count();
    assert!(
        mine > 50 && theirs > 50,
        "too few strategy changes to judge ({mine} here, {theirs} there, {polls} polls; {})",
        reports[0]
    );
    let wrong: Vec<_> = seen
        .iter()
        .filter(|(p, s)| {
            (*p == me && *s != Strategy::Park)
                || (*p == child_pid && *s != Strategy::Spin { budget_ns: 4096 })
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "{} of {} StrategyChanged entries name the other process's strategy, e.g. {:?} \
         (parent pid {me} publishes park, child pid {child_pid} spin(4096ns))",
        wrong.len(),
        seen.len(),
        &wrong[..wrong.len().min(4)]
    );
}

/// Tickets taken by producers that died before they claimed their slots (SIGKILL between
/// the `fetch_add` on `head` and the claim CAS; or a `head` pushed forward by a corrupt
/// writer): 64 positions whose slots name older tickets. Docs: readers "re-check for a
/// bounded time (64 spins, 8 yields), then count it lost"; "readers wait for an
/// unfinished entry only briefly"; a reader never blocks on a dead process. On a machine
/// whose cores are busy (here: three spinning threads on two cores, as during a build),
/// one `read_since` over those positions must still be brief, and the sidecar's poll,
/// which runs it for every instance, with it.
// Found (fixed since): read_pos bounds the wait per position by a count of sched_yield calls (8), not by time; each yield on a busy core can cost a scheduler slice, so 64 dead positions (512 yields) take hundreds of ms per read.
#[test]
fn a_read_over_tickets_of_dead_producers_is_brief_on_a_busy_machine() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dead.probe");
    let probe = Probe::create(&path);
    let raw = open_raw(&path);
    let ring = probe.ring();
    for i in 0..64 {
        ring.record_code(0x7C00, 0, i);
    }
    // 64 producers took tickets 64..128 and died before claiming their slots.
    raw.head().w[W_HEAD].fetch_add(64, Ordering::Relaxed);
    let stop = AtomicBool::new(false);
    let (mut worst, mut total) = (Duration::ZERO, Duration::ZERO);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            });
        }
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..3 {
            let t = Instant::now();
            let b = ring.read_since(64);
            let took = t.elapsed();
            assert_eq!((b.observations.len(), b.lost, b.next), (0, 64, 128));
            worst = worst.max(took);
            total += took;
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        worst < Duration::from_millis(50),
        "one read over 64 dead producers' tickets took up to {worst:?} ({total:?} for 3) \
         with the cores busy"
    );
}
