//! The `cxc` command.
#![forbid(unsafe_code)]

use clap::Parser;

/// Observe and use cxc primitives from the shell.
#[derive(Parser, Debug)]
#[command(name = "cxc", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
    println!("cxc: no commands yet");
}
