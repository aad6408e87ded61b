//! A small page shared by the harness processes: a file mapped `MAP_SHARED`.
//!
//! Layout (all offsets in bytes): `0..LOCKS_END` holds baseline lock state (one 64-byte
//! cell per lock: a `pthread_mutex_t` or a futex word), `FLAGS..` holds 32-bit flags and
//! 64-bit counters the roles use to rendezvous.

use std::fs::OpenOptions;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64};

use memmap2::{MmapOptions, MmapRaw};

/// Size of the shared page.
pub const PAGE: usize = 4096;
/// Bytes per lock cell (a `pthread_mutex_t` is 40 bytes on Linux x86-64/aarch64).
pub const CELL: usize = 64;
/// Number of lock cells.
pub const CELLS: usize = 8;
/// First byte after the lock cells.
pub const FLAGS: usize = CELLS * CELL;

/// Indices of the 32-bit flags (`flag(i)` is at `FLAGS + 4 * i`).
pub mod flag {
    /// A child is set up and about to block / start.
    pub const READY: usize = 0;
    /// The parent says go.
    pub const START: usize = 1;
    /// The parent says stop.
    pub const STOP: usize = 2;
    /// The raw futex ping-pong word.
    pub const PING: usize = 3;
    /// Number of 32-bit flags.
    pub const COUNT: usize = 16;
}

/// Indices of the 64-bit counters (after the flags).
pub mod counter {
    /// The shared value the throughput workload increments under the baseline lock.
    pub const VALUE: usize = 0;
}

const _: () = assert!(FLAGS + 4 * flag::COUNT + 8 * 8 <= PAGE);
const _: () = assert!(size_of::<libc::pthread_mutex_t>() <= CELL);

/// A shared page mapped from a file.
#[derive(Debug)]
pub struct SharedPage {
    map: MmapRaw,
}

impl SharedPage {
    /// Creates (zero-filled) or opens the page file at `path` and maps it.
    ///
    /// # Errors
    /// I/O errors opening, sizing or mapping the file.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() < PAGE as u64 {
            file.set_len(PAGE as u64)?;
        }
        let map = MmapOptions::new().len(PAGE).map_raw(&file)?;
        Ok(SharedPage { map })
    }

    /// Raw pointer to lock cell `i` (64-byte aligned, `CELL` bytes).
    pub fn cell(&self, i: usize) -> *mut u8 {
        assert!(i < CELLS, "lock cell {i} out of range");
        // SAFETY: `i * CELL < FLAGS <= PAGE`, inside the mapping of `PAGE` bytes.
        unsafe { self.map.as_mut_ptr().add(i * CELL) }
    }

    /// The 32-bit word at the start of lock cell `i` (a futex word).
    pub fn cell_u32(&self, i: usize) -> &AtomicU32 {
        // SAFETY: the cell is 64-byte aligned (the mapping is page aligned) and lies in the
        // mapping, which lives as long as `self`; the page is only accessed atomically
        // (or through pthread calls on cells that hold a mutex, never both for one cell).
        unsafe { AtomicU32::from_ptr(self.cell(i).cast()) }
    }

    /// Flag `i` (see [`flag`]).
    pub fn flag(&self, i: usize) -> &AtomicU32 {
        assert!(i < flag::COUNT, "flag {i} out of range");
        // SAFETY: `FLAGS + 4 * i` is 4-byte aligned and inside the page (const-asserted);
        // the mapping lives as long as `self` and the flags are only accessed atomically.
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(FLAGS + 4 * i).cast()) }
    }

    /// Counter `i` (see [`counter`]).
    pub fn counter(&self, i: usize) -> &AtomicU64 {
        assert!(i < 8, "counter {i} out of range");
        let off = FLAGS + 4 * flag::COUNT + 8 * i;
        // SAFETY: `off` is 8-byte aligned and inside the page (const-asserted); the mapping
        // lives as long as `self` and counters are only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(off).cast()) }
    }
}
