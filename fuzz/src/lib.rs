//! Shared harness of the cxc fuzz targets: turn a fuzz input into a file on disk.
//!
//! An input is one flags byte followed by the file's bytes. The flags let the fuzzer
//! keep a mutated file self-consistent, so that mutations reach the primitives' own
//! validation and protocol code instead of dying at the header checksum:
//!
//! | bit | constant        | effect                                                     |
//! |-----|-----------------|------------------------------------------------------------|
//! | 0   | [`FIX_CHECKSUM`] | recompute the header checksum after the other fix-ups      |
//! | 1   | [`FIX_LENGTH`]   | resize the file (and `total_len`) to what the header's     |
//! |     |                 | layout implies, when that is at most [`MAX_FIXED_LEN`]      |
//!
//! The init-state word is always set to ready: a not-ready cxc file makes `open` wait
//! two seconds for its creator, which is tested elsewhere and would only slow fuzzing.
//!
//! The seed corpora (`cargo xtask fuzz` writes them) are valid files prefixed with
//! `FIX_CHECKSUM | FIX_LENGTH`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cxc_mmf::HEADER_LEN;
use cxc_mmf::header::{INIT_READY, fnv1a, off};

/// Flags bit: recompute the header checksum.
pub const FIX_CHECKSUM: u8 = 1;
/// Flags bit: make the file length and `total_len` match the header's layout.
pub const FIX_LENGTH: u8 = 2;
/// Largest file [`FIX_LENGTH`] grows an input to.
pub const MAX_FIXED_LEN: u64 = 1 << 20;

fn u32_at(f: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(f[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(f: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(f[at..at + 8].try_into().expect("8 bytes"))
}

/// The file bytes for a fuzz input (see the module docs).
pub fn file_bytes(input: &[u8]) -> Vec<u8> {
    let Some((&flags, rest)) = input.split_first() else {
        return Vec::new();
    };
    let mut f = rest.to_vec();
    if f.len() < HEADER_LEN {
        return f;
    }
    if flags & FIX_LENGTH != 0 {
        let head = u64::from(u32_at(&f, off::HEAD_SIZE));
        let slot = u64::from(u32_at(&f, off::SLOT_SIZE));
        let total = slot
            .checked_mul(u64_at(&f, off::CAPACITY))
            .and_then(|s| s.checked_add(head + HEADER_LEN as u64));
        if let Some(total) = total.filter(|&t| t <= MAX_FIXED_LEN) {
            f.resize(total as usize, 0);
            f[off::TOTAL_LEN..off::TOTAL_LEN + 8].copy_from_slice(&total.to_ne_bytes());
        }
    }
    f[off::INIT_STATE..off::INIT_STATE + 4].copy_from_slice(&INIT_READY.to_ne_bytes());
    if flags & FIX_CHECKSUM != 0 {
        let sum = fnv1a(&f[..off::INIT_STATE]);
        f[off::CHECKSUM..off::CHECKSUM + 8].copy_from_slice(&sum.to_ne_bytes());
    }
    f
}

/// This process's scratch directory (in `/dev/shm` when it exists), made once.
/// Directories left by fuzz processes that are gone are removed on first use.
fn scratch_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        if let Ok(entries) = std::fs::read_dir(&base) {
            for e in entries.flatten() {
                let name = e.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("cxc-fuzz-")) else {
                    continue;
                };
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = base.join(format!("cxc-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fuzz scratch directory");
        dir
    })
}

/// Writes the file for `input` to this process's scratch path (the same path every
/// call; nothing may still map it) and returns the path.
pub fn write_input(input: &[u8]) -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    let path = PATH.get_or_init(|| scratch_dir().join("input.cxc"));
    std::fs::write(path, file_bytes(input)).expect("write the fuzz input file");
    path
}

/// A pid no process has (above the kernel's `PID_MAX_LIMIT` of 2^22).
pub const FAKE_PID: u32 = 0x7FFF_FFF0;

/// A fuzz target that writes each input to the scratch file ([`write_input`]), opens it
/// with `open` and, when that succeeds, runs `body` with the handle and the path.
///
/// ```ignore
/// cxc_fuzz::fuzz_opened!(SharedSemaphore::open, |sem, _path| {
///     let _ = sem.available();
/// });
/// ```
#[macro_export]
macro_rules! fuzz_opened {
    ($open:expr, |$handle:ident, $path:ident| $body:block) => {
        ::libfuzzer_sys::fuzz_target!(|data: &[u8]| {
            let $path = $crate::write_input(data);
            if let Ok($handle) = $open($path) {
                $body
            }
        });
    };
}

/// Calls each named method (no arguments) on `handle` and drops the results: a fuzz
/// target checks only that none of them panics, whatever the file held.
///
/// ```ignore
/// cxc_fuzz::call_each!(sem; available, max_permits, holders);
/// ```
#[macro_export]
macro_rules! call_each {
    ($handle:expr; $($method:ident),+ $(,)?) => {
        $(let _ = $handle.$method();)+
    };
}
