//! `cxc-xbench`: the cross-process bench harness (see `cxc_benches::xbench`).
//!
//! ```text
//! cxc-xbench [--quick] [SECTION...]     run sections (default: all but the extra ones,
//!                                       e.g. `death`), print rows
//! cxc-xbench --role ROLE ARGS...        internal: a child process of a scenario
//! ```

use cxc_benches::xbench::{self, Config, EXTRA_SECTIONS, SECTIONS};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--role") {
        xbench::run_role(&args[1..]);
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let cfg = if quick {
        Config::quick()
    } else {
        Config::full()
    };
    let chosen: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    for s in &chosen {
        assert!(
            SECTIONS.contains(s) || EXTRA_SECTIONS.contains(s),
            "unknown section {s:?}; sections: {SECTIONS:?}, extra: {EXTRA_SECTIONS:?}"
        );
    }
    for s in SECTIONS {
        if chosen.is_empty() || chosen.contains(&s) {
            eprintln!("xbench: section {s}");
            xbench::run_section(s, &cfg);
        }
    }
    for s in EXTRA_SECTIONS {
        if chosen.contains(&s) {
            eprintln!("xbench: section {s}");
            xbench::run_section(s, &cfg);
        }
    }
}
