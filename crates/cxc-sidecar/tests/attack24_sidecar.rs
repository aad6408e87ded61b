//! Round 24 of attacks on the sidecar (docs/sidecar.md): two processes whose sidecars
//! poll one file while a third records into it — reading must not consume, and each
//! process's stats must count every observation.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Probe, private_sidecar};
use cxc_sidecar::SidecarBox;
use cxc_testkit::{Proc, RoleCommand, num, path_arg, play_role, report, wait_until};

/// Probe counters used as mailboxes: the observers' progress (positions processed), and
/// the stop flag.
const C_PROGRESS: usize = 4;
const C_STOP: usize = 8;
const C_READY: usize = 9;
/// Op codes recorded by the producer (outside the known ones), one per burst parity.
const CODE_A: u16 = 0x7A01;
const CODE_B: u16 = 0x7A02;

/// An observer: a `SidecarBox` over the probe in its own (private) sidecar, polled in a
/// loop; publishes `observed + lost` in its mailbox, and at the end its stats.
fn role_observer() {
    let index: usize = cxc_testkit::arg("index").parse().unwrap();
    let sc = private_sidecar();
    let probe = SidecarBox::new_in(sc, Probe::open(&path_arg("path")), None);
    let mailbox = &probe.state().counters[C_PROGRESS + index];
    probe.state().counters[C_READY].fetch_add(1, Ordering::AcqRel);
    loop {
        let stop = probe.state().counters[C_STOP].load(Ordering::Acquire) != 0;
        sc.poll();
        let st = probe.stats();
        mailbox.store(st.observed + st.lost, Ordering::Release);
        if stop {
            report(format_args!(
                "observed={} lost={} a={} b={}",
                st.observed,
                st.lost,
                st.ops.get(&CODE_A).copied().unwrap_or(0),
                st.ops.get(&CODE_B).copied().unwrap_or(0),
            ));
            return;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
}

/// docs/sidecar.md, Pitfalls: "Stats are per process. Each process's sidecar counts what
/// *it* drained; two processes polling the same file each see every observation (reading
/// does not consume)." This process records 2000 events in bursts of 16 (a quarter of the
/// ring), waiting after each burst until both observer processes' sidecars have polled
/// past it, so nothing is overwritten before either reads it; each must then count all
/// 2000, split by op as recorded, with none lost.
#[test]
fn two_processes_polling_one_file_each_see_every_observation() {
    play_role!(role_observer);
    const TEST: &str = "two_processes_polling_one_file_each_see_every_observation";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.probe");
    let probe = Probe::create(&path);
    let mut kids: Vec<Proc> = (0..2)
        .map(|i| {
            RoleCommand::new(TEST, "observer")
                .arg("path", &path)
                .arg("index", i.to_string())
                .spawn()
        })
        .collect();
    assert!(
        wait_until(Duration::from_secs(20), || probe.state().counters[C_READY]
            .load(Ordering::Acquire)
            == 2),
        "observers did not start"
    );
    let progress = |i: usize| probe.state().counters[C_PROGRESS + i].load(Ordering::Acquire);
    let ring = &probe.state().ring;
    let (mut a, mut b) = (0u64, 0u64);
    for burst in 0..125u64 {
        for j in 0..16u64 {
            if (burst + j) % 3 == 0 {
                probe.event(CODE_A, 0, j);
                a += 1;
            } else {
                probe.event(CODE_B, 0, j);
                b += 1;
            }
        }
        let head = ring.head();
        assert!(
            wait_until(Duration::from_secs(20), || progress(0) >= head
                && progress(1) >= head),
            "observers did not poll past {head}: {} and {}",
            progress(0),
            progress(1)
        );
    }
    assert_eq!(ring.head(), 2000);
    probe.state().counters[C_STOP].store(1, Ordering::Release);
    for k in &mut kids {
        let r = k.finish(Duration::from_secs(20));
        assert_eq!(r.len(), 1, "{r:?}");
        let line = &r[0];
        assert_eq!(
            (num(line, "observed"), num(line, "lost")),
            (2000, 0),
            "an observer did not see every observation: {line}"
        );
        assert_eq!((num(line, "a"), num(line, "b")), (a, b), "{line}");
    }
}
