//! A Rust process on the same lease file as the Python tests (interop test).
//!
//! `lease_hold FILE hold SECS`: lock (blocking), print `held TOKEN`, hold for SECS while
//! beating, release, print `released`. `lease_hold FILE try`: print `busy` or
//! `got TOKEN` (and release).

use std::io::Write;
use std::time::Duration;

mod common;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (path, mode) = (&args[1], args[2].as_str());
    let (lease, _) = cxc::OwnerLease::builder(path)
        .grace(Duration::from_secs(1))
        .create_or_open([0u8; 48])
        .expect("open the lease");
    let mut out = std::io::stdout();
    match mode {
        "hold" => {
            let g = lease.lock();
            let held = format!("held {}", g.token());
            common::hold_for(&args[3], &held, Duration::from_millis(50), || {
                g.beat().expect("still held");
            });
            g.unlock().expect("released while held");
            writeln!(out, "released").unwrap();
        }
        "try" => match lease.try_lock() {
            Some(g) => writeln!(out, "got {}", g.token()).unwrap(),
            None => writeln!(out, "busy").unwrap(),
        },
        m => panic!("unknown mode {m}"),
    }
}
