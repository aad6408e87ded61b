//! Helpers shared by the integration tests: layouts and file patching. Running part of a
//! test in a child process (so that a fault in the code under test kills the child, not
//! the test run) is `cxc_testkit`'s.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, MmfError, TypeFingerprint};

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
