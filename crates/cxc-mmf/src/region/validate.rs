//! Validation of a header against the format, its own lengths and checksum, and what the
//! caller expects; and of the view types against a layout.

use crate::error::{FoundKind, MmfError};
use crate::header::{ENDIAN_MARK, FORMAT_VERSION, HEADER_LEN, HeaderInfo, Kind, Layout, MAGIC};
use std::sync::atomic::Ordering;

use super::codec::HeaderWords;
use super::options::Expect;

pub(super) fn check_layout_shapes<H, S>(layout: &Layout) -> Result<(), MmfError> {
    let bad = |m: String| Err(MmfError::InvalidLayout(m));
    if !layout.head_size.is_multiple_of(64) {
        return bad(format!(
            "head size {} is not a multiple of 64",
            layout.head_size
        ));
    }
    if size_of::<H>() > layout.head_size as usize {
        return bad(format!(
            "head view of {} bytes does not fit a {}-byte block",
            size_of::<H>(),
            layout.head_size
        ));
    }
    if align_of::<H>() > 64 || align_of::<S>() > 64 {
        return bad("view alignment above 64".into());
    }
    if layout.capacity > 0 {
        if layout.slot_size as usize != size_of::<S>() || size_of::<S>() == 0 {
            return bad(format!(
                "slot size {} does not match slot view of {} bytes",
                layout.slot_size,
                size_of::<S>()
            ));
        }
        if !(layout.slot_size as usize).is_multiple_of(align_of::<S>()) {
            return bad("slot size is not a multiple of the slot alignment".into());
        }
    }
    if layout.total_len().is_none() {
        return bad(format!(
            "{} slots of {} bytes exceed the {}-byte file limit",
            layout.capacity,
            layout.slot_size,
            crate::MAX_FILE_LEN
        ));
    }
    Ok(())
}

/// Generic header validation for a file of unknown or expected kind: identity checks,
/// then lengths and checksum.
pub(super) fn parse_header(
    h: HeaderWords<'_>,
    file_len: u64,
    expect_kind: Option<Kind>,
) -> Result<HeaderInfo, MmfError> {
    let info = check_identity(h, expect_kind)?;
    check_lengths_and_sum(h, info, file_len)
}

/// Magic, byte order, version, header length and kind; returns the raw fields.
pub(super) fn check_identity(
    h: HeaderWords<'_>,
    expect_kind: Option<Kind>,
) -> Result<HeaderInfo, MmfError> {
    check_format(h)?;
    let header_len = h.header_len.load(Ordering::Relaxed);
    if header_len as usize != HEADER_LEN {
        return Err(MmfError::ParamMismatch {
            name: "header_len",
            expected: HEADER_LEN.to_string(),
            found: u64::from(header_len),
        });
    }
    let code = h.kind.load(Ordering::Relaxed);
    let kind = match (expect_kind, Kind::from_code(code)) {
        (Some(want), Some(k)) if want == k => k,
        (Some(want), found) => {
            return Err(MmfError::WrongKind {
                expected: want,
                found: found.map_or(FoundKind::Unknown(code), FoundKind::Known),
            });
        }
        (None, Some(k)) => k,
        (None, None) => {
            return Err(MmfError::ParamMismatch {
                name: "kind",
                expected: "a known primitive kind".into(),
                found: u64::from(code),
            });
        }
    };
    Ok(h.read_fields(kind))
}

/// Magic, byte order and version: is this a cxc file of this format at all?
pub(super) fn check_format(h: HeaderWords<'_>) -> Result<(), MmfError> {
    let magic = h.magic.load(Ordering::Relaxed);
    if magic != MAGIC {
        return Err(MmfError::BadMagic {
            expected: MAGIC,
            found: magic,
        });
    }
    let endian = h.endian.load(Ordering::Relaxed);
    if endian != ENDIAN_MARK {
        return Err(MmfError::Endianness {
            expected: ENDIAN_MARK,
            found: endian,
        });
    }
    let version = h.version.load(Ordering::Relaxed);
    if version != FORMAT_VERSION {
        return Err(MmfError::UnsupportedVersion {
            expected: FORMAT_VERSION,
            found: version,
        });
    }
    Ok(())
}

/// Length and checksum checks, after the caller-specific layout checks (if any) passed.
pub(super) fn check_lengths_and_sum(
    h: HeaderWords<'_>,
    info: HeaderInfo,
    file_len: u64,
) -> Result<HeaderInfo, MmfError> {
    let layout = &info.layout;
    if !layout.head_size.is_multiple_of(64) {
        return Err(MmfError::ParamMismatch {
            name: "head_size",
            expected: "a multiple of 64".into(),
            found: u64::from(layout.head_size),
        });
    }
    let Some(total) = layout.total_len() else {
        return Err(MmfError::ParamMismatch {
            name: "capacity",
            expected: format!("a layout of at most {} bytes", crate::header::MAX_FILE_LEN),
            found: layout.capacity,
        });
    };
    if info.total_len != total {
        return Err(MmfError::ParamMismatch {
            name: "total_len",
            expected: total.to_string(),
            found: info.total_len,
        });
    }
    if file_len != total {
        return Err(MmfError::WrongLength {
            expected: total,
            found: file_len,
        });
    }
    let sum = h.checksum();
    let stored = h.checksum.load(Ordering::Relaxed);
    if sum != stored {
        return Err(MmfError::HeaderChecksum {
            expected: sum,
            found: stored,
        });
    }
    Ok(info)
}

pub(super) fn check_expect(info: &HeaderInfo, expect: &Expect<'_>) -> Result<(), MmfError> {
    let l = &info.layout;
    if l.head_size != expect.head_size {
        return Err(MmfError::ParamMismatch {
            name: "head_size",
            expected: expect.head_size.to_string(),
            found: u64::from(l.head_size),
        });
    }
    if l.slot_size != expect.slot_size {
        return Err(MmfError::ParamMismatch {
            name: "slot_size",
            expected: expect.slot_size.to_string(),
            found: u64::from(l.slot_size),
        });
    }
    match expect.capacity {
        Some(c) if c != l.capacity => {
            return Err(MmfError::ParamMismatch {
                name: "capacity",
                expected: c.to_string(),
                found: l.capacity,
            });
        }
        // A holder or heartbeat table needs a slot (an empty one could never register
        // anyone); other kinds (e.g. the test kind) may have none.
        _ if l.capacity == 0
            && matches!(
                expect.kind,
                Kind::Semaphore | Kind::RwLock | Kind::Heartbeat
            ) =>
        {
            return Err(MmfError::ParamMismatch {
                name: "capacity",
                expected: format!("1..={}", expect.max_capacity),
                found: 0,
            });
        }
        _ if l.capacity > expect.max_capacity => {
            return Err(MmfError::ParamMismatch {
                name: "capacity",
                expected: format!("at most {}", expect.max_capacity),
                found: l.capacity,
            });
        }
        _ => {}
    }
    if l.payload != expect.payload {
        return Err(MmfError::TypeMismatch {
            expected: expect.payload,
            found: l.payload,
        });
    }
    (expect.check_params)(&l.params)
}
