//! Text and JSON renderings of an inspected file.

use std::fmt::Write;

use cxc::EpochMode;
use serde_json::{Value, json};

use crate::inspect::{State, View};

fn epoch_mode(m: EpochMode) -> String {
    match m {
        EpochMode::Manual => "manual".into(),
        EpochMode::Clock { tick } => format!("clock, tick {tick:?}"),
    }
}

/// Human-readable view.
pub(crate) fn text(v: &View) -> String {
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
                (Some(p), Some(st)) => format!("pid {p} (start time {st})"),
                (Some(p), None) => format!("pid {p} (no OS identity recorded)"),
                (None, _) => "vacant".into(),
            };
            let _ = writeln!(s, "  owner:       {owner}");
            let _ = writeln!(s, "  generation:  {}", l.generation);
            let _ = writeln!(
                s,
                "  heartbeat:   epoch {} (age {} epochs); epoch {} ({})",
                l.heartbeat_epoch,
                l.epoch.saturating_sub(l.heartbeat_epoch),
                l.epoch,
                epoch_mode(l.epoch_mode)
            );
            let _ = writeln!(s, "  preemption:  {:?}", l.preemption);
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
                    "  {:>5}  {:>8}  {:>6}  {:>10}  {:>6}  {:#018x}  {}",
                    i,
                    snap.pid,
                    snap.generation,
                    snap.last_seen_epoch,
                    h.epoch.saturating_sub(snap.last_seen_epoch),
                    snap.in_flight_bitmap,
                    if snap.fenced { "fenced" } else { "live" }
                );
            }
            let counters: Vec<String> =
                h.counters.iter().map(|(n, c)| format!("{n}={c}")).collect();
            let _ = writeln!(s, "  counters:    {}", counters.join(" "));
        }
    }
    s
}

/// Machine-readable view.
pub(crate) fn json(v: &View) -> Value {
    let state = match &v.state {
        State::Lease(l) => json!({
            "owner": l.owner,
            "owner_start": l.owner_start,
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
            })).collect::<Vec<_>>(),
            "counters": h.counters.iter().map(|(n, c)| (n.to_string(), json!(c)))
                .collect::<serde_json::Map<_, _>>(),
        }),
    };
    json!({
        "path": v.path.display().to_string(),
        "kind": v.info.layout.kind.name(),
        "creator_pid": v.info.creator_pid,
        "total_len": v.info.total_len,
        "state": state,
    })
}
