//! Helpers shared by the integration tests: layouts, file patching, and running part of a
//! test in a child process (a re-exec of the test binary) so that a fault in the code
//! under test kills the child, not the test run.

#![allow(dead_code)] // each test binary uses a different subset

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, MmfError, TypeFingerprint};

/// Environment variable that tells a re-executed test binary which role to play.
pub(crate) const ROLE_VAR: &str = "CXC_TEST_ROLE";
/// Environment variable carrying the file the child works on.
pub(crate) const PATH_VAR: &str = "CXC_TEST_PATH";
/// Prefix of the lines a child prints for its parent.
pub(crate) const RESULT_PREFIX: &str = "CXC-RESULT ";
/// How long a child may run before the parent kills it and fails.
pub(crate) const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// The fixed block used by the test layouts.
pub(crate) type Head = [AtomicU64; 8];
/// The slot used by the test layouts.
pub(crate) type Slot = AtomicU64;
/// A mapping with the test layout.
pub(crate) type TestMap = Mapped<Head, Slot>;

/// Number of slots in the test layout.
pub(crate) const CAPACITY: u64 = 4;
/// Total length of a file with the test layout.
pub(crate) const TOTAL: u64 = 128 + 64 + 8 * CAPACITY;

/// The role this process plays, if it was started as a child.
pub(crate) fn role() -> Option<String> {
    std::env::var(ROLE_VAR).ok()
}

/// A layout of `kind` with a 64-byte head and [`CAPACITY`] 8-byte slots.
pub(crate) fn layout(kind: Kind) -> Layout {
    Layout {
        kind,
        head_size: 64,
        slot_size: 8,
        capacity: CAPACITY,
        payload: TypeFingerprint::of::<u64>(),
        params: [7, 0, 0, 0],
    }
}

/// Accepts the parameters `layout` writes.
pub(crate) fn check_params(p: &[u64; 4]) -> Result<(), MmfError> {
    if p[0] == 7 {
        Ok(())
    } else {
        Err(MmfError::ParamMismatch {
            name: "param0",
            expected: "7".into(),
            found: p[0],
        })
    }
}

/// What `open` expects of a file made with [`layout`].
pub(crate) fn expect(kind: Kind) -> Expect<'static> {
    Expect {
        kind,
        head_size: 64,
        slot_size: 8,
        capacity: None,
        max_capacity: 1024,
        payload: TypeFingerprint::of::<u64>(),
        check_params: &check_params,
    }
}

/// Creates a valid file with [`layout`]; head word 0 holds 41, slot i holds i.
pub(crate) fn make_valid(path: &Path, kind: Kind) -> TestMap {
    Mapped::create(
        path,
        layout(kind),
        &CreateOptions::default(),
        |h: &Head, s: &[Slot]| {
            h[0].store(41, std::sync::atomic::Ordering::Relaxed);
            for (i, slot) in s.iter().enumerate() {
                slot.store(i as u64, std::sync::atomic::Ordering::Relaxed);
            }
        },
    )
    .expect("create a valid test file")
}

/// Overwrites `bytes` at `offset` in the file (no other change).
pub(crate) fn patch(path: &Path, offset: usize, bytes: &[u8]) {
    let mut data = std::fs::read(path).expect("read file to patch");
    data[offset..offset + bytes.len()].copy_from_slice(bytes);
    std::fs::write(path, data).expect("write patched file");
}

/// Reads the native-endian `u64` at `offset`.
pub(crate) fn read_u64(path: &Path, offset: usize) -> u64 {
    let data = std::fs::read(path).expect("read file");
    u64::from_ne_bytes(data[offset..offset + 8].try_into().unwrap())
}

/// The name of an error's variant, as children report it.
pub(crate) fn variant_name(e: &MmfError) -> &'static str {
    match e {
        MmfError::NotFound { .. } => "NotFound",
        MmfError::AlreadyExists { .. } => "AlreadyExists",
        MmfError::Symlink { .. } => "Symlink",
        MmfError::NotAFile { .. } => "NotAFile",
        MmfError::TooShort { .. } => "TooShort",
        MmfError::WrongLength { .. } => "WrongLength",
        MmfError::BadMagic { .. } => "BadMagic",
        MmfError::Endianness { .. } => "Endianness",
        MmfError::UnsupportedVersion { .. } => "UnsupportedVersion",
        MmfError::WrongKind { .. } => "WrongKind",
        MmfError::ParamMismatch { .. } => "ParamMismatch",
        MmfError::TypeMismatch { .. } => "TypeMismatch",
        MmfError::HeaderChecksum { .. } => "HeaderChecksum",
        MmfError::NotInitialised { .. } => "NotInitialised",
        MmfError::InvalidLayout(_) => "InvalidLayout",
        MmfError::Io { .. } => "Io",
        _ => "Unknown",
    }
}

/// Starts this test binary again, running only `test` (exact name), with `role` and the
/// extra environment `envs`. Its stdout is piped.
pub(crate) fn spawn_child(test: &str, role: &str, envs: &[(&str, String)]) -> Child {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = Command::new(exe);
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child test process")
}

/// Waits (bounded) for `child`, asserts it exited normally with status 0 (it was not
/// killed by a signal and no assertion failed in it), and returns the payloads of its
/// [`RESULT_PREFIX`] lines.
pub(crate) fn finish_child(mut child: Child, what: &str) -> Vec<String> {
    // Drain the pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for child") {
            break status;
        }
        if start.elapsed() > CHILD_DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: child did not finish within {CHILD_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    assert_eq!(
        status.signal(),
        None,
        "{what}: child was killed by signal {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        status.signal()
    );
    assert!(
        status.success(),
        "{what}: child failed ({status})\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let lines: Vec<String> = stdout
        .lines()
        // libtest prints "test name ... " without a newline before the test's own output.
        .filter_map(|l| l.split_once(RESULT_PREFIX))
        .map(|(_, rest)| rest.to_owned())
        .collect();
    assert!(
        !lines.is_empty(),
        "{what}: child printed no result (did it run the test?)\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    lines
}
