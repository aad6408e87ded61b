//! `cxc create cell` and `inspect`/`watch` of a shared cell, on the built binary: the
//! published value in hex, the counters, recent observations, every output format.

use std::process::{Command, Output, Stdio};

use cxc::AdaptiveInstance;
use cxc_cli::{CELL_BYTES, CellBytes};

mod common;
use common::p;

fn cxc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cxc"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run cxc")
}

fn out(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn create_cell_then_inspect_shows_the_published_value() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("config.cell");
    out(&cxc(&["create", "cell", p(&f), "--value", "0x0102ff"]));
    let text = out(&cxc(&["inspect", p(&f)]));
    let zeros = "00".repeat(CELL_BYTES - 3);
    assert!(
        text.contains(&format!("value:       0102ff{zeros} (48 bytes, hex)")),
        "{text}"
    );
    assert!(text.contains("claim_stalled_writer=0"), "{text}");

    // Another process stores through the library; inspect shows the new value.
    let cell = cxc::SharedCell::<CellBytes>::open(&f).unwrap();
    let mut v = [0u8; CELL_BYTES];
    v[CELL_BYTES - 1] = 0xab;
    cell.store(v).unwrap();
    cell.ring().record(cxc::OpCode::LeaseClaimStale, 0, 7);

    let json: serde_json::Value =
        serde_json::from_str(out(&cxc(&["inspect", "--json", p(&f)])).trim()).unwrap();
    assert_eq!(json["kind"], "cell");
    assert_eq!(json["state"]["value_hex"], format!("{}ab", "00".repeat(47)));
    assert_eq!(json["state"]["value_bytes"], 48);
    assert_eq!(json["state"]["counters"]["claim_dead_writer"], 0);
    let recent = json["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 1, "{json}");
    assert_eq!(recent[0]["op"], "lease.claim.stale");
    assert_eq!(recent[0]["arg"], 7);

    let text = out(&cxc(&["inspect", p(&f)]));
    assert!(text.contains("lease.claim.stale"), "{text}");

    let prom = out(&cxc(&["inspect", "--format", "prometheus", p(&f)]));
    let lines = prom.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("valid exposition format");
    let info = scrape
        .samples
        .iter()
        .find(|s| s.metric == "cxc_cell_info")
        .expect("cxc_cell_info");
    assert_eq!(
        info.labels.get("value"),
        Some(format!("{}ab", "00".repeat(47)).as_str())
    );
    let events: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "cxc_cell_events_total")
        .collect();
    assert!(
        events
            .iter()
            .any(|s| s.labels.get("event") == Some("claim_stalled_writer"))
    );
    assert!(prom.contains("# TYPE cxc_cell_events_total counter"));

    // watch prints the same report (plain successive reports, not on a terminal).
    let mut child = Command::new(env!("CARGO_BIN_EXE_cxc"))
        .args(["watch", p(&f), "--interval", "100ms"])
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
    while !first.contains("recent:") {
        let mut line = String::new();
        assert!(std::io::BufRead::read_line(&mut reader, &mut line).unwrap() > 0);
        first.push_str(&line);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        first.contains(&format!("{}ab (48 bytes, hex)", "00".repeat(47))),
        "{first}"
    );
}

#[test]
fn bad_cells_and_values_give_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    // A cell of another payload type: its bytes are shown raw (as many as the type has).
    let other = dir.path().join("other.cell");
    cxc::SharedCell::create(&other, [1u64, 2]).unwrap();
    let text = out(&cxc(&["inspect", p(&other)]));
    let want = [1u64, 2]
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    assert!(
        text.contains(&format!("value:       {want} (16 bytes, hex)")),
        "{text}"
    );

    let f = dir.path().join("c");
    for bad in ["zz", "abc", &"00".repeat(49), "é1"] {
        let o = cxc(&["create", "cell", p(&f), "--value", bad]);
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(!f.exists());
    }
    out(&cxc(&["create", "cell", p(&f)]));
    let o = cxc(&["create", "cell", p(&f)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
}
