//! A control file for multi-process tests: eight `AtomicU64`s in a `Kind::Test` file,
//! beside the primitive under test, for counters and flags its processes share.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::sync::atomic::AtomicU64;

use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, TypeFingerprint};

/// A mapped control file.
pub type Ctl = Mapped<[AtomicU64; 8]>;

/// Creates the control file at `path`, all words zero.
pub fn create(path: &Path) -> Ctl {
    let layout = Layout {
        kind: Kind::Test,
        head_size: 64,
        slot_size: 0,
        capacity: 0,
        payload: TypeFingerprint::NONE,
        params: [0; 4],
    };
    Mapped::create(path, layout, &CreateOptions::default(), |_, _| {})
        .expect("create the control file")
}

/// Opens the control file another process created at `path`.
pub fn open(path: &Path) -> Ctl {
    let expect = Expect {
        kind: Kind::Test,
        head_size: 64,
        slot_size: 0,
        capacity: Some(0),
        max_capacity: 0,
        payload: TypeFingerprint::NONE,
        check_params: &|_| Ok(()),
    };
    Mapped::open(path, &expect).expect("open the control file")
}
