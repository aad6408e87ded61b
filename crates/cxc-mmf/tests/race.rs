//! `create_or_open` raced by several processes: exactly one creates and initialises, all
//! succeed, and all map the same file.
//!
//! The parent re-executes this test binary as [`PROCS`] children (role `race`);
//! each spins until a shared start instant, then calls `create_or_open`, checks it sees the
//! creator's initial value, and increments a counter in the head.

mod common;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{CHILD_DEADLINE, TestMap, expect, layout};
use cxc_mmf::{CreateOptions, Kind, Mapped, Origin};
use cxc_testkit::{RoleCommand, arg, fields, in_role, path_arg, report};

const TEST: &str = "create_or_open_race_has_exactly_one_creator";
const ROLE: &str = "race";
const PROCS: usize = 8;
const ROUNDS: usize = 4;
/// Written by the creator's `init` into head word 0.
const INIT_VALUE: u64 = 0xC0FF_EE00_1234_5678;
/// Head words: 0 = init value, 1 = creator pid (from `init`), 2 = opener count.
const W_INIT: usize = 0;
const W_CREATOR: usize = 1;
const W_COUNT: usize = 2;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
}

/// The child: wait for the start instant, race, report.
fn child() {
    let path = path_arg("path");
    let start: u128 = arg("start_ns").parse().expect("start instant in ns");
    let arrived = now_ns();
    assert!(
        start.saturating_sub(arrived) < 30_000_000_000,
        "start instant too far ahead"
    );
    while now_ns() < start {
        std::hint::spin_loop();
    }
    let pid = u64::from(std::process::id());
    let (m, origin) = TestMap::create_or_open(
        &path,
        layout(Kind::Test),
        &CreateOptions::default(),
        &expect(Kind::Test),
        |h, _| {
            h[W_INIT].store(INIT_VALUE, Ordering::Relaxed);
            h[W_CREATOR].store(pid, Ordering::Relaxed);
        },
    )
    .expect("create_or_open in a race");
    // Whoever created it, the initial value must be visible once we hold a mapping.
    let init = m.head()[W_INIT].load(Ordering::Acquire);
    let creator = m.head()[W_CREATOR].load(Ordering::Acquire);
    m.head()[W_COUNT].fetch_add(1, Ordering::AcqRel);
    let origin = match origin {
        Origin::Created => "Created",
        Origin::Opened => "Opened",
    };
    report(format_args!(
        "origin={origin} pid={pid} init={init} creator={creator} \
         header_creator={} early_us={}",
        m.info().creator_pid,
        start.saturating_sub(arrived) / 1000,
    ));
}

#[test]
fn create_or_open_race_has_exactly_one_creator() {
    if in_role(ROLE) {
        child();
        return;
    }
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.cxc");
        // Far enough ahead that every child has exec'd and is spinning when it passes.
        let start = now_ns() + Duration::from_millis(400).as_nanos();
        let mut children: Vec<_> = (0..PROCS)
            .map(|_| {
                RoleCommand::new(TEST, ROLE)
                    .arg("path", &path)
                    .arg("start_ns", start.to_string())
                    .spawn()
            })
            .collect();
        let pids: Vec<u64> = children.iter().map(|c| u64::from(c.pid())).collect();
        let reports: Vec<String> = children
            .iter_mut()
            .map(|c| {
                let mut lines = c.finish(CHILD_DEADLINE);
                assert_eq!(lines.len(), 1, "round {round}: {lines:?}");
                lines.remove(0)
            })
            .collect();

        let parsed: Vec<HashMap<&str, &str>> = reports.iter().map(|r| fields(r)).collect();
        let created: Vec<&HashMap<&str, &str>> =
            parsed.iter().filter(|f| f["origin"] == "Created").collect();
        assert_eq!(created.len(), 1, "round {round}: creators {reports:#?}");
        let creator_pid: u64 = created[0]["pid"].parse().unwrap();
        assert!(
            pids.contains(&creator_pid),
            "round {round}: unknown creator pid"
        );
        let late = parsed.iter().filter(|f| f["early_us"] == "0").count();
        if late > 0 {
            eprintln!("round {round}: {late} of {PROCS} children arrived after the start instant");
        }
        for f in &parsed {
            assert!(matches!(f["origin"], "Created" | "Opened"), "{f:?}");
            assert_eq!(f["init"], INIT_VALUE.to_string(), "round {round}: {f:?}");
            assert_eq!(
                f["creator"],
                creator_pid.to_string(),
                "round {round}: {f:?}"
            );
            assert_eq!(
                f["header_creator"],
                creator_pid.to_string(),
                "round {round}: {f:?}"
            );
        }

        // One file, holding every child's increment.
        let m: TestMap = Mapped::open(&path, &expect(Kind::Test)).expect("open after race");
        assert_eq!(m.head()[W_COUNT].load(Ordering::Acquire), PROCS as u64);
        assert_eq!(m.head()[W_INIT].load(Ordering::Acquire), INIT_VALUE);
        assert_eq!(m.head()[W_CREATOR].load(Ordering::Acquire), creator_pid);
        assert_eq!(u64::from(m.info().creator_pid), creator_pid);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            ["f.cxc"],
            "round {round}: temporary files left behind"
        );
    }
}
