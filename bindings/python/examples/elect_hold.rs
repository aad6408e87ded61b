//! A Rust candidate in the election on the same file as the Python tests (interop test).
//!
//! `elect_hold FILE lead SECS`: campaign (blocking), print `leader TOKEN`, renew for SECS,
//! step down, print `stepped-down`. `elect_hold FILE try`: print `busy` or `leader TOKEN`
//! (and step down). The identity is `rust`, the lease duration 1 s.

use std::io::Write;
use std::time::Duration;

use cxc::{ElectionConfig, Elector, MmapElection};

mod common;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (path, mode) = (&args[1], args[2].as_str());
    let grace = Duration::from_secs(1);
    let backend = MmapElection::create_or_open(path, grace).expect("open the election file");
    let elector =
        Elector::new(backend, ElectionConfig::new("rust").lease_duration(grace)).expect("config");
    let mut out = std::io::stdout();
    match mode {
        "lead" => {
            let l = loop {
                if let Some(l) = elector.campaign(Duration::from_secs(1)).expect("campaign") {
                    break l;
                }
            };
            let leader = format!("leader {}", l.token());
            common::hold_for(&args[3], &leader, Duration::from_millis(20), || {
                l.renew().expect("still leading");
            });
            l.step_down().expect("stepped down while leading");
            writeln!(out, "stepped-down").unwrap();
        }
        "try" => match elector.campaign(Duration::ZERO).expect("campaign") {
            Some(l) => {
                writeln!(out, "leader {}", l.token()).unwrap();
                l.step_down().expect("step down");
            }
            None => writeln!(out, "busy").unwrap(),
        },
        m => panic!("unknown mode {m}"),
    }
}
