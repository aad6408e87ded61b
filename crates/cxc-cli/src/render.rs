//! Text and JSON renderings of an inspected file.

use std::fmt::Write;
use std::time::Duration;

use cxc::EpochMode;
use serde_json::{Value, json};

use crate::inspect::{State, TestView, View};

fn epoch_mode(m: EpochMode) -> String {
    match m {
        EpochMode::Manual => "manual".into(),
        EpochMode::Clock { tick } => format!("clock, tick {tick:?}"),
    }
}

/// A duration for people: seconds with milliseconds under a minute, else h/min/s.
fn human(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{:.3} s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{} min {} s", secs / 60, secs % 60)
    } else {
        format!("{} h {} min", secs / 3600, (secs % 3600) / 60)
    }
}

/// How long the current claim of `l` has been held: epochs, and time for clock epochs.
fn held_for(l: &cxc::LeaseStatus) -> Option<(u64, Option<Duration>)> {
    let e = l.claimed_epoch?;
    let age = l.epoch.saturating_sub(e);
    let time = match l.epoch_mode {
        EpochMode::Clock { tick } => u32::try_from(age).ok().map(|a| tick * a),
        EpochMode::Manual => None,
    };
    Some((age, time))
}

/// "process: CMD (started T ago)" lines for a live holder, indented by `indent`.
fn process_lines(s: &mut String, indent: &str, pid: u32, mark: &str) {
    let (cmd, age) = crate::holder_process(pid, mark);
    if let Some(c) = cmd {
        let _ = writeln!(s, "{indent}command:     {c}");
    }
    if let Some(a) = age {
        let _ = writeln!(s, "{indent}process up:  {} (process start time)", human(a));
    }
}

/// Human-readable view, as `cxc inspect` prints it (ends with a newline).
pub fn text(v: &View) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} {} (created by pid {})",
        v.info.layout.kind,
        v.path.display(),
        v.info.creator_pid
    );
    match &v.state {
        State::Lease(l) => {
            let owner = match (l.owner, l.owner_start) {
                (Some(p), Some(st)) => format!(
                    "pid {p} [{}] (identity {st})",
                    crate::liveness_mark(p, Some(st))
                ),
                (Some(p), None) => format!(
                    "pid {p} [{}] (no OS identity recorded)",
                    crate::liveness_mark(p, None)
                ),
                (None, _) => "vacant".into(),
            };
            let _ = writeln!(s, "  owner:       {owner}");
            if let Some(p) = l.owner {
                let mark = crate::liveness_mark(p, l.owner_start);
                let (cmd, _) = crate::holder_process(p, mark);
                if let Some(c) = cmd {
                    let _ = writeln!(s, "  command:     {c}");
                }
                let since = match (l.claimed_epoch, held_for(l)) {
                    (Some(e), Some((age, Some(t)))) => {
                        format!("epoch {e}, held for {} ({age} epochs)", human(t))
                    }
                    (Some(e), Some((age, None))) => format!("epoch {e}, held for {age} epochs"),
                    _ => "unknown (no claim time recorded for this claim)".into(),
                };
                let _ = writeln!(s, "  since:       {since}");
            }
            let _ = writeln!(s, "  generation:  {} (the fencing token)", l.generation);
            let _ = writeln!(
                s,
                "  heartbeat:   epoch {} (age {} epochs); epoch {} ({})",
                l.heartbeat_epoch,
                l.epoch.saturating_sub(l.heartbeat_epoch),
                l.epoch,
                epoch_mode(l.epoch_mode)
            );
            let _ = writeln!(
                s,
                "  mode:        preemption {:?}, {} epochs",
                l.preemption,
                epoch_mode(l.epoch_mode)
            );
            let _ = writeln!(
                s,
                "  payload:     {} bytes, words {:?}",
                l.payload_type.size, l.payload_words
            );
            let _ = writeln!(
                s,
                "  state:       {}{}",
                if l.torn {
                    "TORN: the holder inherited an interrupted update"
                } else {
                    "consistent"
                },
                if l.writing { ", write in flight" } else { "" }
            );
            let _ = writeln!(s, "  waiters:     {}", l.waiters);
            let counters: Vec<String> = cxc::lease::counter::NAMES
                .iter()
                .zip(l.counters)
                .map(|(n, c)| format!("{n}={c}"))
                .collect();
            let _ = writeln!(s, "  counters:    {}", counters.join(" "));
        }
        State::Heartbeat(h) => {
            let _ = writeln!(
                s,
                "  capacity:    {} slots, {} in use; epoch {} ({})",
                h.capacity,
                h.slots.len(),
                h.epoch,
                epoch_mode(h.epoch_mode)
            );
            let _ = writeln!(
                s,
                "  {:>5}  {:>8}  {:>6}  {:>10}  {:>6}  {:<18}  state",
                "slot", "pid", "gen", "last_seen", "lag", "in_flight"
            );
            for (i, snap) in &h.slots {
                let _ = writeln!(
                    s,
                    "  {:>5}  {:>8}  {:>6}  {:>10}  {:>6}  {:#018x}  {} [{}]",
                    i,
                    snap.pid,
                    snap.generation,
                    snap.last_seen_epoch,
                    h.epoch.saturating_sub(snap.last_seen_epoch),
                    snap.in_flight_bitmap,
                    if snap.fenced { "fenced" } else { "registered" },
                    crate::liveness_mark(snap.pid, None)
                );
            }
            let counters: Vec<String> =
                h.counters.iter().map(|(n, c)| format!("{n}={c}")).collect();
            let _ = writeln!(s, "  counters:    {}", counters.join(" "));
        }
        State::Semaphore(m) => {
            let _ = writeln!(
                s,
                "  permits:     {}/{} available ({} in use)",
                m.available,
                m.max,
                m.max - m.available.min(m.max)
            );
            let _ = writeln!(
                s,
                "  holders:     {} of {} slots",
                m.holders.len(),
                m.holder_capacity
            );
            for h in &m.holders {
                let mark = crate::liveness_mark(h.pid, None);
                let _ = writeln!(
                    s,
                    "    slot {:>3}  pid {:>8} [{}]  holds {}{}",
                    h.slot,
                    h.pid,
                    mark,
                    h.held,
                    if h.reclaiming {
                        "  (being reclaimed)"
                    } else {
                        ""
                    }
                );
                process_lines(&mut s, "      ", h.pid, mark);
            }
            let st = &m.stats;
            let _ = writeln!(
                s,
                "  counters:    contended={} sleeps={} timeouts={} wakes={} overflow_rejected={} reclaimed_permits={} reclaimed_holders={}",
                st.contended,
                st.sleeps,
                st.timeouts,
                st.wakes,
                st.overflow_rejected,
                st.reclaimed_permits,
                st.reclaimed_holders
            );
        }
        State::Cell(c) => {
            let _ = writeln!(
                s,
                "  value:       {} ({} bytes, hex)",
                c.hex(),
                c.value.len()
            );
            let counters: Vec<String> =
                c.counters.iter().map(|(n, v)| format!("{n}={v}")).collect();
            let _ = writeln!(s, "  counters:    {}", counters.join(" "));
        }
        State::RwLock(r) => rwlock_text(&mut s, r),
        State::Test(t) => test_text(&mut s, t),
    }
    if let Some((strategy, generation)) = v.strategy {
        let _ = writeln!(s, "  strategy:    {strategy:?} (generation {generation})");
    }
    if v.strategy.is_none() {
        // Kinds without a shared strategy have no observation ring either.
    } else if v.recent.is_empty() {
        let _ = writeln!(
            s,
            "  recent:      none recorded (observations are recorded while a SidecarBox observes a handle)"
        );
    } else {
        let _ = writeln!(
            s,
            "  recent:      last {} observations",
            v.recent.len().min(10)
        );
        let now = cxc::sidecar::monotonic_ns();
        for o in v.recent.iter().rev().take(10).rev() {
            let _ = writeln!(
                s,
                "    -{:>9.3}s  pid {:>8}  {:<26} flags {:#06x}  arg {}",
                now.saturating_sub(o.timestamp_ns) as f64 / 1e9,
                o.pid,
                o.op.name(),
                o.flags,
                o.arg
            );
        }
    }
    s
}

fn rwlock_text(s: &mut String, r: &cxc::RwLockSnapshot) {
    match r.writer {
        Some((slot, pid)) => {
            let mark = crate::liveness_mark(pid, None);
            let _ = writeln!(s, "  writer:      pid {pid} [{mark}] (slot {slot})");
            process_lines(s, "  ", pid, mark);
        }
        None => {
            let _ = writeln!(s, "  writer:      none");
        }
    }
    let _ = writeln!(
        s,
        "  token:       {} (fencing token of the current or last write lock); writer progress {}",
        r.token, r.beat
    );
    let _ = writeln!(
        s,
        "  holders:     {} of {} slots (grace {:?})",
        r.holders.len(),
        r.holder_capacity,
        Duration::from_nanos(r.grace_ns)
    );
    for h in &r.holders {
        let mark = crate::liveness_mark(h.pid, None);
        let _ = writeln!(
            s,
            "    slot {:>3}  pid {:>8} [{}]  read holds {}",
            h.slot, h.pid, mark, h.readers
        );
        process_lines(s, "      ", h.pid, mark);
    }
    let value = crate::inspect::payload_bytes(&r.payload_words, r.payload_type.size);
    let _ = writeln!(
        s,
        "  value:       {} ({} bytes, hex)",
        crate::inspect::hex(&value),
        value.len()
    );
    let counters: Vec<String> = r.counters.iter().map(|(n, v)| format!("{n}={v}")).collect();
    let _ = writeln!(s, "  counters:    {}", counters.join(" "));
}

fn test_text(s: &mut String, t: &TestView) {
    match t.names {
        Some((head, unit)) => {
            let _ = writeln!(s, "  layout:      the work board of `cxc demo`");
            let fields: Vec<String> = head
                .iter()
                .zip(&t.head)
                .map(|(n, v)| format!("{n}={v}"))
                .collect();
            let _ = writeln!(s, "  board:       {}", fields.join(" "));
            for (i, u) in t.slots.iter().enumerate() {
                let fields: Vec<String> = unit
                    .iter()
                    .zip(u)
                    .map(|(n, v)| {
                        if *n == "state" {
                            format!("{n}={v:#x}")
                        } else {
                            format!("{n}={v}")
                        }
                    })
                    .collect();
                let _ = writeln!(s, "    unit {i:>3}  {}", fields.join(" "));
            }
        }
        None => {
            let _ = writeln!(s, "  head words:  {:?}", t.head);
            for (i, w) in t.slots.iter().enumerate() {
                let _ = writeln!(s, "    slot {i:>3}  {w:?}");
            }
        }
    }
}

/// Machine-readable view, as `cxc inspect --json` prints it.
pub fn json(v: &View) -> Value {
    let state = match &v.state {
        State::Lease(l) => json!({
            "owner": l.owner,
            "owner_start": l.owner_start,
            "owner_state": l.owner.map(|p| crate::liveness_mark(p, l.owner_start)),
            "owner_cmdline": l.owner.and_then(|p| crate::holder_process(p, crate::liveness_mark(p, l.owner_start)).0),
            "claimed_epoch": l.claimed_epoch,
            "held_for_epochs": held_for(l).map(|h| h.0),
            "held_for_s": held_for(l).and_then(|h| h.1).map(|d| d.as_secs_f64()),
            "generation": l.generation,
            "heartbeat_epoch": l.heartbeat_epoch,
            "epoch": l.epoch,
            "epoch_mode": epoch_mode(l.epoch_mode),
            "preemption": format!("{:?}", l.preemption),
            "writing": l.writing,
            "torn": l.torn,
            "waiters": l.waiters,
            "payload_size": l.payload_type.size,
            "payload_words": l.payload_words,
            "counters": cxc::lease::counter::NAMES.iter().zip(l.counters)
                .map(|(n, c)| (n.to_string(), json!(c))).collect::<serde_json::Map<_, _>>(),
        }),
        State::Heartbeat(h) => json!({
            "capacity": h.capacity,
            "epoch": h.epoch,
            "epoch_mode": epoch_mode(h.epoch_mode),
            "slots": h.slots.iter().map(|(i, s)| json!({
                "slot": i,
                "pid": s.pid,
                "generation": s.generation,
                "last_seen_epoch": s.last_seen_epoch,
                "lag": h.epoch.saturating_sub(s.last_seen_epoch),
                "in_flight_bitmap": s.in_flight_bitmap,
                "fenced": s.fenced,
                "state": crate::liveness_mark(s.pid, None),
            })).collect::<Vec<_>>(),
            "counters": h.counters.iter().map(|(n, c)| (n.to_string(), json!(c)))
                .collect::<serde_json::Map<_, _>>(),
        }),
        State::Semaphore(m) => json!({
            "available": m.available,
            "max_permits": m.max,
            "holder_capacity": m.holder_capacity,
            "holders": m.holders.iter().map(|h| json!({
                "slot": h.slot, "pid": h.pid, "held": h.held, "reclaiming": h.reclaiming,
                "state": crate::liveness_mark(h.pid, None),
                "cmdline": crate::holder_process(h.pid, crate::liveness_mark(h.pid, None)).0,
                "process_age_s": crate::holder_process(h.pid, crate::liveness_mark(h.pid, None)).1.map(|d| d.as_secs_f64()),
            })).collect::<Vec<_>>(),
            "counters": {
                "contended": m.stats.contended,
                "sleeps": m.stats.sleeps,
                "timeouts": m.stats.timeouts,
                "wakes": m.stats.wakes,
                "overflow_rejected": m.stats.overflow_rejected,
                "reclaimed_permits": m.stats.reclaimed_permits,
                "reclaimed_holders": m.stats.reclaimed_holders,
                "registered": m.stats.registered,
                "table_full": m.stats.table_full,
                "not_held_rejected": m.stats.not_held_rejected,
                "handed": m.stats.handed,
                "reclaim_scans": m.stats.reclaim_scans,
            },
        }),
        State::Cell(c) => json!({
            "value_hex": c.hex(),
            "value_bytes": c.value.len(),
            "counters": c.counters.iter().map(|(n, v)| (n.to_string(), json!(v)))
                .collect::<serde_json::Map<_, _>>(),
        }),
        State::RwLock(r) => {
            let value = crate::inspect::payload_bytes(&r.payload_words, r.payload_type.size);
            json!({
                "writer": r.writer.map(|(slot, pid)| json!({
                    "slot": slot,
                    "pid": pid,
                    "state": crate::liveness_mark(pid, None),
                    "cmdline": crate::holder_process(pid, crate::liveness_mark(pid, None)).0,
                })),
                "token": r.token,
                "writer_progress": r.beat,
                "grace_ns": r.grace_ns,
                "holder_capacity": r.holder_capacity,
                "holders": r.holders.iter().map(|h| json!({
                    "slot": h.slot,
                    "pid": h.pid,
                    "readers": h.readers,
                    "state": crate::liveness_mark(h.pid, None),
                    "cmdline": crate::holder_process(h.pid, crate::liveness_mark(h.pid, None)).0,
                })).collect::<Vec<_>>(),
                "value_hex": crate::inspect::hex(&value),
                "value_bytes": value.len(),
                "counters": r.counters.iter().map(|(n, v)| (n.to_string(), json!(v)))
                    .collect::<serde_json::Map<_, _>>(),
            })
        }
        State::Test(t) => match t.names {
            Some((head, unit)) => json!({
                "layout": "demo-board",
                "board": head.iter().zip(&t.head).map(|(n, v)| (n.to_string(), json!(v)))
                    .collect::<serde_json::Map<_, _>>(),
                "units": t.slots.iter().map(|u| unit.iter().zip(u)
                    .map(|(n, v)| (n.to_string(), json!(v)))
                    .collect::<serde_json::Map<_, _>>()).collect::<Vec<_>>(),
            }),
            None => json!({ "head_words": t.head, "slot_words": t.slots }),
        },
    };
    let recent: Vec<Value> = v
        .recent
        .iter()
        .map(|o| {
            json!({
                "ticket": o.ticket,
                "timestamp_ns": o.timestamp_ns,
                "pid": o.pid,
                "op": o.op.name(),
                "flags": o.flags,
                "arg": o.arg,
            })
        })
        .collect();
    json!({
        "strategy": v.strategy.map(|st| format!("{:?}", st.0)),
        "strategy_generation": v.strategy.map(|st| st.1),
        "recent": recent,
        "path": v.path.display().to_string(),
        "kind": v.info.layout.kind.name(),
        "creator_pid": v.info.creator_pid,
        "total_len": v.info.total_len,
        "state": state,
    })
}
