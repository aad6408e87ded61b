//! Seed corpora for the fuzz targets: valid files of each kind in interesting states
//! (vacant, held, fenced, with holders, with observations and a published strategy).
//!
//! Each seed is one flags byte (`FIX_CHECKSUM | FIX_LENGTH`, see `fuzz/src/lib.rs`)
//! followed by the file's bytes, copied while the handles that shaped it are still open.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cxc::{
    AdaptiveInstance, EpochMode, FailoverWatchdog, HeartbeatOptions, HeartbeatTable, LeaseOptions,
    OwnerLease, Preemption, SemaphoreOptions, SharedSemaphore, SidecarBox, Strategy,
};

/// The flags byte of every seed: recompute the checksum, fix the length.
const SEED_FLAGS: u8 = 0b11;
/// A pid no process has (for registrations that are not this process).
const FAKE_PID: u32 = 0x7FFF_FFF0;

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> io::Result<Self> {
        let dir = std::env::temp_dir().join(format!("cxc-fuzz-seeds-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        Ok(Scratch(dir))
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Seeds as (name, file bytes), by kind.
#[derive(Default)]
struct Seeds {
    lease: Vec<(String, Vec<u8>)>,
    heartbeat: Vec<(String, Vec<u8>)>,
    semaphore: Vec<(String, Vec<u8>)>,
}

fn snap(path: &Path, name: &str, into: &mut Vec<(String, Vec<u8>)>) -> io::Result<()> {
    into.push((name.to_string(), std::fs::read(path)?));
    Ok(())
}

fn err(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

fn leases(s: &Scratch, out: &mut Vec<(String, Vec<u8>)>) -> io::Result<()> {
    let me = std::process::id();

    let p = s.path("vacant.lease");
    let _l = OwnerLease::<u64>::create(&p, 0).map_err(err)?;
    snap(&p, "lease_u64_vacant", out)?;

    let p = s.path("held.lease");
    let l = OwnerLease::<u64>::create(&p, 7).map_err(err)?;
    l.try_acquire(me, 3);
    assert!(l.write_as_owner(me, 42), "seed: the holder's write");
    l.tick_epoch();
    assert!(l.beat(me), "seed: the holder's beat");
    snap(&p, "lease_u64_held_by_me", out)?;
    // Taken over as stale by another pid, which is then left writing.
    for _ in 0..5 {
        l.tick_epoch();
    }
    let c = l.try_claim(FAKE_PID, 1);
    if let Some(c) = &c {
        assert!(l.write_claimed(c, 9), "seed: the new claim's write");
    }
    snap(&p, "lease_u64_stale_takeover", out)?;
    let _ = l.with_lease(FAKE_PID, 1, |v| {
        *v += 1;
        let _ = std::fs::read(&p).map(|b| out.push(("lease_u64_writing".into(), b)));
    });

    let p = s.path("wide.lease");
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        ..LeaseOptions::default()
    };
    let l = OwnerLease::<[u64; 6]>::create_with(&p, [1, 2, 3, 4, 5, 6], &opts).map_err(err)?;
    l.try_acquire(FAKE_PID, 1_000);
    snap(&p, "lease_6w_clock_never_held", out)?;

    let p = s.path("observed.lease");
    let _raw = OwnerLease::<u64>::create(&p, 0).map_err(err)?;
    let b = SidecarBox::new(OwnerLease::<u64>::open(&p).map_err(err)?);
    let c = b.try_claim(FAKE_PID, 3);
    b.try_acquire(me, 3);
    if let Some(c) = &c {
        // Whatever it returns, the file it leaves is the seed.
        let _ = b.write_claimed(c, 1);
    }
    b.release(me);
    b.acquire(FAKE_PID, 3, Duration::from_millis(1));
    b.apply(Strategy::Park);
    snap(&p, "lease_u64_observed", out)?;
    Ok(())
}

fn heartbeats(s: &Scratch, out: &mut Vec<(String, Vec<u8>)>) -> io::Result<()> {
    let me = std::process::id();

    let p = s.path("one.hb");
    let _t = HeartbeatTable::create(&p, 1).map_err(err)?;
    snap(&p, "hb_1_empty", out)?;

    let p = s.path("busy.hb");
    let t = HeartbeatTable::create(&p, 4).map_err(err)?;
    let mine = t.register(me).map_err(err)?;
    t.mark_in_flight(mine, 3);
    t.mark_in_flight(mine, 63);
    t.beat(mine);
    let other = t.register(FAKE_PID).map_err(err)?;
    t.mark_in_flight(other, 0);
    snap(&p, "hb_4_busy", out)?;
    let wd = FailoverWatchdog::with_grace(&t, 1);
    for _ in 0..3 {
        t.beat(mine);
        wd.scan();
    }
    snap(&p, "hb_4_fenced", out)?;
    wd.reclaim(other);
    wd.sweep_idle();
    snap(&p, "hb_4_reclaimed", out)?;

    let p = s.path("clock.hb");
    let opts = HeartbeatOptions {
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(10),
        },
        ..HeartbeatOptions::default()
    };
    let t = HeartbeatTable::create_with(&p, 16, &opts).map_err(err)?;
    let slot = t.register(me).map_err(err)?;
    t.mark_in_flight(slot, 1);
    snap(&p, "hb_16_clock", out)?;

    let p = s.path("observed.hb");
    let t = SidecarBox::new(HeartbeatTable::create(&p, 2).map_err(err)?);
    let slot = t.register(FAKE_PID).map_err(err)?;
    t.mark_in_flight(slot, 5);
    let wd = FailoverWatchdog::with_grace(&t, 1);
    for _ in 0..3 {
        wd.scan();
    }
    wd.reclaim(slot);
    t.beat(slot);
    t.apply(Strategy::Park);
    snap(&p, "hb_2_observed", out)?;
    Ok(())
}

fn semaphores(s: &Scratch, out: &mut Vec<(String, Vec<u8>)>) -> io::Result<()> {
    let p = s.path("one.sem");
    let _s = SharedSemaphore::create(&p, 1, 1).map_err(err)?;
    snap(&p, "sem_1_of_1", out)?;

    let p = s.path("busy.sem");
    let sem = SharedSemaphore::create_with(&p, 3, 5, &SemaphoreOptions::default().holders(4))
        .map_err(err)?;
    if let Some(permit) = sem.try_acquire() {
        permit.disown();
    }
    let held = sem.try_acquire();
    snap(&p, "sem_5_two_held", out)?;
    drop(held);

    let p = s.path("observed.sem");
    let sem = SidecarBox::new(SharedSemaphore::create(&p, 1, 1).map_err(err)?);
    let held = sem.try_acquire();
    let _ = sem.acquire_timeout(Duration::from_millis(1));
    drop(held);
    let _ = sem.release();
    sem.apply(Strategy::Park);
    snap(&p, "sem_1_observed", out)?;
    Ok(())
}

fn generate() -> io::Result<Seeds> {
    let s = Scratch::new()?;
    let mut seeds = Seeds::default();
    leases(&s, &mut seeds.lease)?;
    heartbeats(&s, &mut seeds.heartbeat)?;
    semaphores(&s, &mut seeds.semaphore)?;
    Ok(seeds)
}

fn write(dir: &Path, seeds: &[&(String, Vec<u8>)]) -> io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in seeds {
        let mut input = Vec::with_capacity(bytes.len() + 1);
        input.push(SEED_FLAGS);
        input.extend_from_slice(bytes);
        std::fs::write(dir.join(format!("seed-{name}")), input)?;
    }
    Ok(seeds.len())
}

/// Writes every target's seeds into `corpus/<target>/seed-*`; returns how many files.
pub(crate) fn write_all(corpus: &Path) -> io::Result<usize> {
    let seeds = generate()?;
    let all: Vec<_> = seeds
        .lease
        .iter()
        .chain(&seeds.heartbeat)
        .chain(&seeds.semaphore)
        .collect();
    let mut n = 0;
    for target in super::TARGETS {
        let these: Vec<_> = match target {
            "open_lease" => seeds.lease.iter().collect(),
            "open_heartbeat" => seeds.heartbeat.iter().collect(),
            "open_semaphore" => seeds.semaphore.iter().collect(),
            _ => all.clone(),
        };
        n += write(&corpus.join(target), &these)?;
    }
    Ok(n)
}
