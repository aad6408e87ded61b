//! Property tests: `open` and `peek` of arbitrary bytes return `Ok` or `Err`, never panic
//! and never map more than the file holds.
//!
//! These run in-process: `open` maps only lengths it has validated against the file, so a
//! hostile file here is an error, not a fault (a fault would kill the test run, which is a
//! failure too).

use std::path::Path;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use cxc_mmf::header::{fnv1a, off};
use cxc_mmf::{
    AtomicView, CreateOptions, Expect, HEADER_LEN, Kind, Layout, Mapped, MmfError, TypeFingerprint,
    peek,
};
use proptest::prelude::*;
use proptest::sample::Index;

/// `Ok` when `ok`, else the mismatch of parameter 0 (`name`, found `p[0]`).
fn param0(p: &[u64; 4], ok: bool, name: &'static str, expected: &str) -> Result<(), MmfError> {
    if ok {
        return Ok(());
    }
    let expected = expected.into();
    Err(MmfError::ParamMismatch {
        name,
        expected,
        found: p[0],
    })
}

fn lease_params(p: &[u64; 4]) -> Result<(), MmfError> {
    param0(p, p[0] <= 1, "epoch_mode", "0 or 1")
}

fn heartbeat_params(p: &[u64; 4]) -> Result<(), MmfError> {
    param0(p, p[0] >= 1, "grace", "at least 1")
}

fn semaphore_params(p: &[u64; 4]) -> Result<(), MmfError> {
    param0(p, (1..=1 << 31).contains(&p[0]), "max_permits", "1..=2^31")
}

fn any_params(_: &[u64; 4]) -> Result<(), MmfError> {
    Ok(())
}

type LeaseHead = [AtomicU64; 16];
type HbSlot = [AtomicU64; 4];
type Head64 = [AtomicU64; 8];

fn lease_expect() -> Expect<'static> {
    Expect {
        kind: Kind::Lease,
        head_size: 128,
        slot_size: 0,
        capacity: Some(0),
        max_capacity: 0,
        payload: TypeFingerprint::of::<[u64; 4]>(),
        check_params: &lease_params,
    }
}

fn heartbeat_expect() -> Expect<'static> {
    Expect {
        kind: Kind::Heartbeat,
        head_size: 64,
        slot_size: 32,
        capacity: None,
        max_capacity: 256,
        payload: TypeFingerprint::NONE,
        check_params: &heartbeat_params,
    }
}

fn semaphore_expect() -> Expect<'static> {
    Expect {
        kind: Kind::Semaphore,
        head_size: 64,
        slot_size: 4,
        capacity: None,
        max_capacity: 4096,
        payload: TypeFingerprint::NONE,
        check_params: &semaphore_params,
    }
}

fn test_expect() -> Expect<'static> {
    Expect {
        kind: Kind::Test,
        head_size: 64,
        slot_size: 8,
        capacity: None,
        max_capacity: 1024,
        payload: TypeFingerprint::of::<u64>(),
        check_params: &any_params,
    }
}

fn layout_of(e: &Expect<'_>, capacity: u64, params: [u64; 4]) -> Layout {
    Layout {
        kind: e.kind,
        head_size: e.head_size,
        slot_size: e.slot_size,
        capacity,
        payload: e.payload,
        params,
    }
}

/// Valid files, one per kind, as bytes: the starting points for mutation.
fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let o = CreateOptions::default();
        let p = |n: &str| dir.path().join(n);
        let fill = |h: &[AtomicU64]| {
            for (i, w) in h.iter().enumerate() {
                w.store(i as u64 * 3 + 1, Ordering::Relaxed);
            }
        };
        let l = layout_of(&lease_expect(), 0, [1, 0, 0, 0]);
        drop(Mapped::<LeaseHead>::create(p("l"), l, &o, |h, _| fill(h)).unwrap());
        let l = layout_of(&heartbeat_expect(), 3, [5, 0, 0, 0]);
        drop(Mapped::<Head64, HbSlot>::create(p("h"), l, &o, |h, _| fill(h)).unwrap());
        let l = layout_of(&semaphore_expect(), 5, [4, 0, 0, 0]);
        drop(Mapped::<Head64, AtomicU32>::create(p("s"), l, &o, |h, _| fill(h)).unwrap());
        let l = layout_of(&test_expect(), 4, [9, 9, 9, 9]);
        drop(Mapped::<Head64, AtomicU64>::create(p("t"), l, &o, |h, _| fill(h)).unwrap());
        ["l", "h", "s", "t"]
            .iter()
            .map(|n| std::fs::read(p(n)).unwrap())
            .collect()
    })
}

/// Touches every word the mapping hands out.
trait Touch {
    fn touch(&self) -> u64;
}
impl Touch for AtomicU64 {
    fn touch(&self) -> u64 {
        self.load(Ordering::Relaxed)
    }
}
impl Touch for AtomicU32 {
    fn touch(&self) -> u64 {
        u64::from(self.load(Ordering::Relaxed))
    }
}
impl Touch for () {
    fn touch(&self) -> u64 {
        0
    }
}
impl<T: Touch, const N: usize> Touch for [T; N] {
    fn touch(&self) -> u64 {
        self.iter().fold(0, |a, t| a.wrapping_add(t.touch()))
    }
}

/// Opens `path` as `H`/`S` with `expect`, without waiting for init-state. On success,
/// checks the mapping agrees with the file and reads every word of it.
fn open_one<H: AtomicView + Touch, S: AtomicView + Touch>(
    path: &Path,
    expect: &Expect<'_>,
) -> Result<(), MmfError> {
    let m = Mapped::<H, S>::open_with_timeout(path, expect, Duration::ZERO)?;
    let file_len = std::fs::metadata(path).unwrap().len();
    assert_eq!(
        m.info().total_len,
        file_len,
        "mapped length differs from the file"
    );
    assert_eq!(m.info().layout.kind, expect.kind);
    assert_eq!(m.slots().len() as u64, m.info().layout.capacity);
    let mut sum = m.head().touch();
    for s in m.slots() {
        sum = sum.wrapping_add(s.touch());
    }
    std::hint::black_box(sum);
    Ok(())
}

/// Opens the file as every kind and peeks it. Returns how many opens succeeded.
fn open_all(bytes: &[u8]) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.cxc");
    std::fs::write(&path, bytes).unwrap();
    let results = [
        open_one::<LeaseHead, ()>(&path, &lease_expect()),
        open_one::<Head64, HbSlot>(&path, &heartbeat_expect()),
        open_one::<Head64, AtomicU32>(&path, &semaphore_expect()),
        open_one::<Head64, AtomicU64>(&path, &test_expect()),
    ];
    if let Ok(info) = peek(&path) {
        assert_eq!(info.total_len, bytes.len() as u64);
        assert!(info.total_len >= HEADER_LEN as u64);
    }
    // A file holds one kind: at most one of the opens can succeed.
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert!(ok <= 1, "one file opened as several kinds: {results:?}");
    ok
}

/// Header fields a structured mutation may rewrite: (offset, width in bytes).
const FIELDS: [(usize, usize); 15] = [
    (off::VERSION, 4),
    (off::KIND, 4),
    (off::HEADER_LEN, 4),
    (off::TOTAL_LEN, 8),
    (off::HEAD_SIZE, 4),
    (off::SLOT_SIZE, 4),
    (off::CAPACITY, 8),
    (off::PAYLOAD_SIZE, 4),
    (off::PAYLOAD_ALIGN, 4),
    (off::TYPE_HASH, 8),
    (off::PARAMS, 8),
    (off::PARAMS + 8, 8),
    (off::CREATOR_PID, 4),
    (off::CREATOR_START, 8),
    (off::INIT_STATE, 4),
];

/// Reads a native-endian header field of `width` (4 or 8) bytes.
fn get(data: &[u8], at: usize, width: usize) -> u64 {
    match width {
        4 => u64::from(u32::from_ne_bytes(data[at..at + 4].try_into().unwrap())),
        _ => u64::from_ne_bytes(data[at..at + 8].try_into().unwrap()),
    }
}

/// Writes a native-endian header field of `width` (4 or 8) bytes; a 4-byte field takes
/// the low 32 bits of `v`.
fn put(data: &mut [u8], at: usize, width: usize, v: u64) {
    match width {
        4 => data[at..at + 4].copy_from_slice(&(v as u32).to_ne_bytes()),
        _ => data[at..at + 8].copy_from_slice(&v.to_ne_bytes()),
    }
}

/// Values that hit boundaries more often than uniform `u64`s do.
fn field_value() -> impl Strategy<Value = u64> {
    prop_oneof![
        any::<u64>(),
        0u64..=1100,
        Just(u64::from(u32::MAX)),
        Just(u64::MAX),
        Just(1 << 40),
        (0u32..64).prop_map(|s| 1u64 << s),
    ]
}

#[test]
fn seeds_open_as_their_own_kind_only() {
    // Positive control: the properties below can see an `Ok`.
    for (i, seed) in seeds().iter().enumerate() {
        assert_eq!(
            open_all(seed),
            1,
            "seed {i} did not open as exactly one kind"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        open_all(&bytes);
    }

    #[test]
    fn valid_header_with_arbitrary_prefix_magic(
        tail in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        // Right magic, byte-order mark and version, the rest arbitrary.
        let mut bytes = seeds()[3][..16].to_vec();
        bytes.extend_from_slice(&tail);
        open_all(&bytes);
    }

    #[test]
    fn mutated_valid_file_never_panics(
        seed in 0usize..4,
        flips in prop::collection::vec((any::<Index>(), any::<u8>()), 0..8),
        new_len in prop_oneof![Just(None), (0usize..800).prop_map(Some)],
    ) {
        let mut bytes = seeds()[seed].clone();
        for (at, b) in flips {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if let Some(n) = new_len {
            bytes.resize(n, 0);
        }
        open_all(&bytes);
    }

    #[test]
    fn rewritten_fields_with_fixed_checksum_never_panic(
        seed in 0usize..4,
        edits in prop::collection::vec((0..FIELDS.len(), field_value()), 1..4),
        fix_lengths in any::<bool>(),
        fix_checksum in any::<bool>(),
    ) {
        // Mutations that pass the checksum (and, optionally, the length checks), so the
        // layout checks behind them are what is exercised.
        let mut bytes = seeds()[seed].clone();
        for (f, v) in edits {
            let (at, width) = FIELDS[f];
            put(&mut bytes, at, width, v);
        }
        if fix_lengths {
            let total = get(&bytes, off::SLOT_SIZE, 4)
                .checked_mul(get(&bytes, off::CAPACITY, 8))
                .and_then(|s| s.checked_add(HEADER_LEN as u64 + get(&bytes, off::HEAD_SIZE, 4)));
            if let Some(total) = total.filter(|&t| t <= 1 << 16) {
                put(&mut bytes, off::TOTAL_LEN, 8, total);
                bytes.resize(total as usize, 0);
            }
        }
        if fix_checksum {
            let sum = fnv1a(&bytes[..off::INIT_STATE]);
            put(&mut bytes, off::CHECKSUM, 8, sum);
        }
        open_all(&bytes);
    }
}
