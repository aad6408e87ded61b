//! Hostile files: every open/create of a missing, short, corrupt, foreign or mismatched
//! file must fail with the exact typed error and never fault.
//!
//! Each hostile operation runs in a child process (this test binary re-executed with
//! `--exact <test>` in role `hostile`, see `cxc_testkit`), so a SIGBUS or abort in the code under
//! test fails the test instead of killing the whole run. The child prints the variant
//! name and checks its fields with `matches!`; the parent checks the child exited normally
//! and printed the expected variant.

mod common;

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{
    CAPACITY, CHILD_DEADLINE, TOTAL, TestMap, expect, layout, make_valid, patch, read_u64,
    variant_name,
};
use cxc_mmf::header::{ENDIAN_MARK, FORMAT_VERSION, off};
use cxc_mmf::{
    CreateOptions, Expect, FoundKind, HEADER_LEN, Kind, MAGIC, Mapped, MmfError, TypeFingerprint,
    peek,
};
use cxc_testkit::{Rng, RoleCommand, arg, in_role, path_arg, report};
use tempfile::TempDir;

const ROLE: &str = "hostile";

/// Runs `action` on the file made by `setup` in a child process and checks that the child
/// exits normally having printed exactly `expected`.
///
/// In the child, runs `action` only if `case` is the one the parent asked for, prints its
/// result and returns `None`. In the parent returns the directory and path for further
/// checks.
fn in_child(
    test: &str,
    case: &str,
    setup: impl FnOnce(&Path) -> PathBuf,
    action: impl FnOnce(&Path) -> String,
    expected: &str,
) -> Option<(TempDir, PathBuf)> {
    if in_role(ROLE) {
        if arg("case") == case {
            report(action(&path_arg("path")));
        }
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = setup(dir.path());
    let lines = RoleCommand::new(test, ROLE)
        .arg("path", &path)
        .arg("case", case)
        .spawn()
        .finish(CHILD_DEADLINE);
    assert_eq!(lines, [expected], "{test}/{case}: child reported {lines:?}");
    Some((dir, path))
}

/// [`in_child`] for an operation that must fail with the variant named `variant`; the
/// child also asserts `check` (a `matches!` on the variant and its fields).
fn hostile<T>(
    test: &str,
    case: &str,
    setup: impl FnOnce(&Path) -> PathBuf,
    op: impl FnOnce(&Path) -> Result<T, MmfError>,
    variant: &str,
    check: impl FnOnce(&MmfError) -> bool,
) -> Option<(TempDir, PathBuf)> {
    in_child(
        test,
        case,
        setup,
        |path| match op(path) {
            Ok(_) => "Ok".to_owned(),
            Err(e) => {
                let name = variant_name(&e);
                if name == variant {
                    assert!(check(&e), "{test}/{case}: unexpected error details: {e:?}");
                } else {
                    eprintln!("{test}/{case}: got {e:?}");
                }
                name.to_owned()
            }
        },
        variant,
    )
}

/// Setup: a valid file of `kind` named `f.cxc`.
fn valid(kind: Kind) -> impl FnOnce(&Path) -> PathBuf {
    move |dir| {
        let path = dir.join("f.cxc");
        drop(make_valid(&path, kind));
        path
    }
}

/// Setup: a valid test file with `bytes` written over it at `offset`.
fn patched(offset: usize, bytes: Vec<u8>) -> impl FnOnce(&Path) -> PathBuf {
    move |dir| {
        let path = valid(Kind::Test)(dir);
        patch(&path, offset, &bytes);
        path
    }
}

/// Setup: a file holding exactly `bytes`.
fn raw(bytes: Vec<u8>) -> impl FnOnce(&Path) -> PathBuf {
    move |dir| {
        let path = dir.join("f.cxc");
        std::fs::write(&path, bytes).expect("write raw file");
        path
    }
}

/// Operation: open with the test expectations for `kind`.
fn open_as(kind: Kind) -> impl FnOnce(&Path) -> Result<TestMap, MmfError> {
    move |path| TestMap::open(path, &expect(kind))
}

/// Operation: `peek` (a plain function, so it is general over the path's lifetime).
fn peek_file(path: &Path) -> Result<cxc_mmf::HeaderInfo, MmfError> {
    peek(path)
}

/// Operation: create a test file at the path.
fn create_test(path: &Path) -> Result<TestMap, MmfError> {
    TestMap::create(
        path,
        layout(Kind::Test),
        &CreateOptions::default(),
        |h, _| h[0].store(99, Ordering::Relaxed),
    )
}

/// Names of the entries in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    v.sort();
    v
}

#[test]
fn valid_file_opens_in_child() {
    // The harness itself: a valid file reports Ok and its contents.
    in_child(
        "valid_file_opens_in_child",
        "open",
        valid(Kind::Test),
        |path| {
            let m = open_as(Kind::Test)(path).expect("valid file opens");
            let slots: Vec<u64> = m
                .slots()
                .iter()
                .map(|s| s.load(Ordering::Relaxed))
                .collect();
            format!(
                "Ok head0={} slots={slots:?}",
                m.head()[0].load(Ordering::Relaxed)
            )
        },
        "Ok head0=41 slots=[0, 1, 2, 3]",
    );
}

#[test]
fn missing_file_is_not_found() {
    let t = "missing_file_is_not_found";
    hostile(
        t,
        "open",
        |d| d.join("nope.cxc"),
        open_as(Kind::Test),
        "NotFound",
        |e| matches!(e, MmfError::NotFound { path } if path.ends_with("nope.cxc")),
    );
    hostile(
        t,
        "peek",
        |d| d.join("nope.cxc"),
        peek_file,
        "NotFound",
        |e| matches!(e, MmfError::NotFound { .. }),
    );
}

#[test]
fn empty_file_is_too_short() {
    let t = "empty_file_is_too_short";
    hostile(
        t,
        "open",
        raw(Vec::new()),
        open_as(Kind::Test),
        "TooShort",
        |e| {
            matches!(
                e,
                MmfError::TooShort {
                    expected: 128,
                    found: 0
                }
            )
        },
    );
    hostile(t, "peek", raw(Vec::new()), peek_file, "TooShort", |e| {
        matches!(
            e,
            MmfError::TooShort {
                expected: 128,
                found: 0
            }
        )
    });
}

#[test]
fn file_shorter_than_header_is_too_short() {
    let t = "file_shorter_than_header_is_too_short";
    // The first 100 bytes of a valid file: a correct magic, cut inside the header.
    let prefix = |d: &Path| {
        let path = valid(Kind::Test)(d);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..100]).unwrap();
        path
    };
    hostile(t, "open", prefix, open_as(Kind::Test), "TooShort", |e| {
        matches!(
            e,
            MmfError::TooShort {
                expected: 128,
                found: 100
            }
        )
    });
    hostile(
        t,
        "one-byte",
        raw(vec![b'C']),
        open_as(Kind::Test),
        "TooShort",
        |e| {
            matches!(
                e,
                MmfError::TooShort {
                    expected: 128,
                    found: 1
                }
            )
        },
    );
    hostile(
        t,
        "127",
        raw(vec![0; HEADER_LEN - 1]),
        peek_file,
        "TooShort",
        |e| {
            matches!(
                e,
                MmfError::TooShort {
                    expected: 128,
                    found: 127
                }
            )
        },
    );
}

#[test]
fn wrong_magic_is_bad_magic() {
    let t = "wrong_magic_is_bad_magic";
    let bad = u64::from_ne_bytes(*b"NOT-CXC!");
    hostile(
        t,
        "open",
        patched(off::MAGIC, bad.to_ne_bytes().to_vec()),
        open_as(Kind::Test),
        "BadMagic",
        |e| matches!(e, MmfError::BadMagic { expected, found } if *expected == MAGIC && *found == bad),
    );
    hostile(
        t,
        "peek",
        patched(off::MAGIC, bad.to_ne_bytes().to_vec()),
        peek_file,
        "BadMagic",
        |e| matches!(e, MmfError::BadMagic { found, .. } if *found == bad),
    );
}

#[test]
fn byte_swapped_mark_is_endianness() {
    let t = "byte_swapped_mark_is_endianness";
    let swapped = ENDIAN_MARK.swap_bytes();
    hostile(
        t,
        "open",
        patched(off::ENDIAN, swapped.to_ne_bytes().to_vec()),
        open_as(Kind::Test),
        "Endianness",
        |e| matches!(e, MmfError::Endianness { expected, found } if *expected == ENDIAN_MARK && *found == swapped),
    );
}

#[test]
fn wrong_version_is_unsupported_version() {
    let t = "wrong_version_is_unsupported_version";
    for (case, v) in [("next", FORMAT_VERSION + 1), ("zero", 0), ("max", u32::MAX)] {
        hostile(
            t,
            case,
            patched(off::VERSION, v.to_ne_bytes().to_vec()),
            open_as(Kind::Test),
            "UnsupportedVersion",
            |e| {
                matches!(e, MmfError::UnsupportedVersion { expected, found }
                    if *expected == FORMAT_VERSION && *found == v)
            },
        );
    }
}

#[test]
fn wrong_kind_is_wrong_kind() {
    let t = "wrong_kind_is_wrong_kind";
    hostile(
        t,
        "lease-as-heartbeat",
        valid(Kind::Lease),
        open_as(Kind::Heartbeat),
        "WrongKind",
        |e| {
            matches!(
                e,
                MmfError::WrongKind {
                    expected: Kind::Heartbeat,
                    found: FoundKind::Known(Kind::Lease),
                }
            )
        },
    );
    hostile(
        t,
        "semaphore-as-test",
        valid(Kind::Semaphore),
        open_as(Kind::Test),
        "WrongKind",
        |e| {
            matches!(
                e,
                MmfError::WrongKind {
                    expected: Kind::Test,
                    found: FoundKind::Known(Kind::Semaphore),
                }
            )
        },
    );
    hostile(
        t,
        "unknown-code",
        patched(off::KIND, 77u32.to_ne_bytes().to_vec()),
        open_as(Kind::Test),
        "WrongKind",
        |e| {
            matches!(
                e,
                MmfError::WrongKind {
                    expected: Kind::Test,
                    found: FoundKind::Unknown(77)
                }
            )
        },
    );
    // peek has no expected kind: an unknown code is a parameter error.
    hostile(
        t,
        "unknown-code-peek",
        patched(off::KIND, 77u32.to_ne_bytes().to_vec()),
        peek_file,
        "ParamMismatch",
        |e| {
            matches!(
                e,
                MmfError::ParamMismatch {
                    name: "kind",
                    found: 77,
                    ..
                }
            )
        },
    );
}

#[test]
fn truncated_body_is_wrong_length() {
    let t = "truncated_body_is_wrong_length";
    let truncate_to = |len: u64| {
        move |d: &Path| {
            let path = valid(Kind::Test)(d);
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(len)
                .unwrap();
            path
        }
    };
    hostile(
        t,
        "into-slots",
        truncate_to(TOTAL - 4),
        open_as(Kind::Test),
        "WrongLength",
        |e| matches!(e, MmfError::WrongLength { expected: TOTAL, found } if *found == TOTAL - 4),
    );
    hostile(
        t,
        "header-only",
        truncate_to(128),
        open_as(Kind::Test),
        "WrongLength",
        |e| {
            matches!(
                e,
                MmfError::WrongLength {
                    expected: TOTAL,
                    found: 128
                }
            )
        },
    );
    hostile(
        t,
        "header-only-peek",
        truncate_to(128),
        peek_file,
        "WrongLength",
        |e| {
            matches!(
                e,
                MmfError::WrongLength {
                    expected: TOTAL,
                    found: 128
                }
            )
        },
    );
    hostile(
        t,
        "longer",
        truncate_to(TOTAL + 4096),
        open_as(Kind::Test),
        "WrongLength",
        |e| matches!(e, MmfError::WrongLength { expected: TOTAL, found } if *found == TOTAL + 4096),
    );
    // The header claims 1000 slots and a matching total length; the file holds 4. Mapping
    // the claimed length would fault on first touch of the missing pages.
    let claims_more = |d: &Path| {
        let path = valid(Kind::Test)(d);
        patch(&path, off::CAPACITY, &1000u64.to_ne_bytes());
        patch(&path, off::TOTAL_LEN, &(128u64 + 64 + 8000).to_ne_bytes());
        path
    };
    hostile(
        t,
        "header-claims-more",
        claims_more,
        open_as(Kind::Test),
        "WrongLength",
        |e| {
            matches!(
                e,
                MmfError::WrongLength {
                    expected: 8192,
                    found: TOTAL
                }
            )
        },
    );
}

#[test]
fn absurd_capacity_is_param_mismatch() {
    let t = "absurd_capacity_is_param_mismatch";
    let huge: u64 = 1 << 40;
    let setup = move |d: &Path| {
        let path = valid(Kind::Test)(d);
        patch(&path, off::CAPACITY, &huge.to_ne_bytes());
        path
    };
    // Above the caller's bound.
    hostile(
        t,
        "above-max",
        setup,
        open_as(Kind::Test),
        "ParamMismatch",
        |e| matches!(e, MmfError::ParamMismatch { name: "capacity", found, .. } if *found == huge),
    );
    // No caller bound: the layout itself exceeds the file-size limit.
    let unbounded = |path: &Path| {
        let mut ex = expect(Kind::Test);
        ex.max_capacity = u64::MAX;
        TestMap::open(path, &ex)
    };
    hostile(
        t,
        "unbounded",
        setup,
        unbounded,
        "ParamMismatch",
        |e| matches!(e, MmfError::ParamMismatch { name: "capacity", found, .. } if *found == huge),
    );
    // slot_size * capacity overflows u64.
    let overflow = |d: &Path| {
        let path = valid(Kind::Test)(d);
        patch(&path, off::CAPACITY, &u64::MAX.to_ne_bytes());
        path
    };
    hostile(t, "overflow", overflow, unbounded, "ParamMismatch", |e| {
        matches!(
            e,
            MmfError::ParamMismatch {
                name: "capacity",
                found: u64::MAX,
                ..
            }
        )
    });
    hostile(
        t,
        "peek",
        setup,
        peek_file,
        "ParamMismatch",
        |e| matches!(e, MmfError::ParamMismatch { name: "capacity", found, .. } if *found == huge),
    );
    // An exact expectation that the file does not meet.
    let exact = |path: &Path| {
        let mut ex = expect(Kind::Test);
        ex.capacity = Some(CAPACITY);
        TestMap::open(path, &ex)
    };
    hostile(
        t,
        "exact",
        setup,
        exact,
        "ParamMismatch",
        |e| matches!(e, MmfError::ParamMismatch { name: "capacity", found, .. } if *found == huge),
    );
}

#[test]
fn other_layout_fields_are_param_mismatch() {
    let t = "other_layout_fields_are_param_mismatch";
    hostile(
        t,
        "header-len",
        patched(off::HEADER_LEN, 256u32.to_ne_bytes().to_vec()),
        open_as(Kind::Test),
        "ParamMismatch",
        |e| {
            matches!(
                e,
                MmfError::ParamMismatch {
                    name: "header_len",
                    found: 256,
                    ..
                }
            )
        },
    );
    hostile(
        t,
        "head-size",
        patched(off::HEAD_SIZE, 128u32.to_ne_bytes().to_vec()),
        open_as(Kind::Test),
        "ParamMismatch",
        |e| {
            matches!(
                e,
                MmfError::ParamMismatch {
                    name: "head_size",
                    found: 128,
                    ..
                }
            )
        },
    );
    hostile(
        t,
        "slot-size",
        patched(off::SLOT_SIZE, 16u32.to_ne_bytes().to_vec()),
        open_as(Kind::Test),
        "ParamMismatch",
        |e| {
            matches!(
                e,
                MmfError::ParamMismatch {
                    name: "slot_size",
                    found: 16,
                    ..
                }
            )
        },
    );
    hostile(
        t,
        "total-len",
        patched(off::TOTAL_LEN, (TOTAL + 8).to_ne_bytes().to_vec()),
        open_as(Kind::Test),
        "ParamMismatch",
        |e| matches!(e, MmfError::ParamMismatch { name: "total_len", found, .. } if *found == TOTAL + 8),
    );
    hostile(
        t,
        "params",
        patched(off::PARAMS, 8u64.to_ne_bytes().to_vec()),
        open_as(Kind::Test),
        "ParamMismatch",
        |e| {
            matches!(
                e,
                MmfError::ParamMismatch {
                    name: "param0",
                    found: 8,
                    ..
                }
            )
        },
    );
}

#[test]
fn random_garbage_is_bad_magic() {
    let t = "random_garbage_is_bad_magic";
    for (case, len, seed) in [("4k", 4096, 1), ("header-sized", 128, 2), ("odd", 1000, 3)] {
        let bytes = Rng::new(seed).bytes(len);
        let found_magic = u64::from_ne_bytes(bytes[..8].try_into().unwrap());
        assert_ne!(found_magic, MAGIC);
        let timed_open = |path: &Path| {
            // Garbage is not a file still being initialised: no waiting for init-state.
            let start = Instant::now();
            let r = open_as(Kind::Test)(path);
            assert!(
                start.elapsed() < Duration::from_secs(1),
                "open waited on garbage"
            );
            r
        };
        hostile(
            t,
            case,
            raw(bytes.clone()),
            timed_open,
            "BadMagic",
            |e| matches!(e, MmfError::BadMagic { found, .. } if *found == found_magic),
        );
        let peek_case = format!("{case}-peek");
        hostile(
            t,
            &peek_case,
            raw(bytes),
            peek_file,
            "BadMagic",
            |e| matches!(e, MmfError::BadMagic { found, .. } if *found == found_magic),
        );
    }
    // All zeros (e.g. a file someone ftruncate'd) is garbage too.
    hostile(
        t,
        "zeros",
        raw(vec![0; 4096]),
        open_as(Kind::Test),
        "BadMagic",
        |e| matches!(e, MmfError::BadMagic { found: 0, .. }),
    );
}

#[test]
fn corrupted_header_byte_is_header_checksum() {
    let t = "corrupted_header_byte_is_header_checksum";
    // Bytes no layout check looks at: the last parameter, the padding after the creator
    // pid, the creator start time, the checksum itself.
    for (case, at) in [
        ("param3", off::PARAMS + 24),
        ("pad", off::CREATOR_PID + 4),
        ("creator-start", off::CREATOR_START + 3),
        ("creator-pid", off::CREATOR_PID),
        ("checksum", off::CHECKSUM + 7),
    ] {
        let setup = move |d: &Path| {
            let path = valid(Kind::Test)(d);
            let byte = std::fs::read(&path).unwrap()[at];
            patch(&path, at, &[byte ^ 0x5a]);
            path
        };
        let op = |path: &Path| {
            let stored = read_u64(path, off::CHECKSUM);
            open_as(Kind::Test)(path).inspect_err(|e| {
                if let MmfError::HeaderChecksum { found, .. } = e {
                    assert_eq!(*found, stored, "`found` must be the stored checksum");
                }
            })
        };
        hostile(
            t,
            case,
            setup,
            op,
            "HeaderChecksum",
            |e| matches!(e, MmfError::HeaderChecksum { expected, found } if expected != found),
        );
        let peek_case = format!("{case}-peek");
        hostile(t, &peek_case, setup, peek_file, "HeaderChecksum", |e| {
            matches!(e, MmfError::HeaderChecksum { .. })
        });
    }
}

#[test]
fn unready_file_is_not_initialised() {
    let t = "unready_file_is_not_initialised";
    let timeout = Duration::from_millis(50);
    let open_short =
        move |path: &Path| TestMap::open_with_timeout(path, &expect(Kind::Test), timeout);
    hostile(
        t,
        "open",
        patched(off::INIT_STATE, 0u32.to_ne_bytes().to_vec()),
        open_short,
        "NotInitialised",
        |e| matches!(e, MmfError::NotInitialised { waited_ms, found: 0 } if *waited_ms >= 50),
    );
    hostile(
        t,
        "peek",
        patched(off::INIT_STATE, 0u32.to_ne_bytes().to_vec()),
        peek_file,
        "NotInitialised",
        |e| matches!(e, MmfError::NotInitialised { found: 0, .. }),
    );
}

#[test]
fn wrong_payload_type_is_type_mismatch() {
    let t = "wrong_payload_type_is_type_mismatch";
    let open_payload = |payload: TypeFingerprint| {
        move |path: &Path| {
            let ex = Expect {
                payload,
                ..expect(Kind::Test)
            };
            TestMap::open(path, &ex)
        }
    };
    let want_u64 = TypeFingerprint::of::<u64>();
    // Same size and alignment, different type.
    let as_i64 = TypeFingerprint::of::<i64>();
    hostile(
        t,
        "i64",
        valid(Kind::Test),
        open_payload(as_i64),
        "TypeMismatch",
        |e| matches!(e, MmfError::TypeMismatch { expected, found } if *expected == as_i64 && *found == want_u64),
    );
    let as_u32 = TypeFingerprint::of::<u32>();
    hostile(
        t,
        "u32",
        valid(Kind::Test),
        open_payload(as_u32),
        "TypeMismatch",
        |e| matches!(e, MmfError::TypeMismatch { expected, found } if *expected == as_u32 && *found == want_u64),
    );
    hostile(
        t,
        "none",
        valid(Kind::Test),
        open_payload(TypeFingerprint::NONE),
        "TypeMismatch",
        |e| matches!(e, MmfError::TypeMismatch { found, .. } if *found == want_u64),
    );
}

#[test]
fn non_regular_file_is_not_a_file() {
    let t = "non_regular_file_is_not_a_file";
    let mkdir = |d: &Path| {
        let path = d.join("f.cxc");
        std::fs::create_dir(&path).unwrap();
        path
    };
    hostile(
        t,
        "dir",
        mkdir,
        open_as(Kind::Test),
        "NotAFile",
        |e| matches!(e, MmfError::NotAFile { path } if path.ends_with("f.cxc")),
    );
    hostile(t, "dir-peek", mkdir, peek_file, "NotAFile", |e| {
        matches!(e, MmfError::NotAFile { .. })
    });
    let mkfifo = |d: &Path| {
        let path = d.join("f.cxc");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        path
    };
    hostile(t, "fifo", mkfifo, open_as(Kind::Test), "NotAFile", |e| {
        matches!(e, MmfError::NotAFile { .. })
    });
    hostile(
        t,
        "dev-null",
        |_| PathBuf::from("/dev/null"),
        peek_file,
        "NotAFile",
        |e| matches!(e, MmfError::NotAFile { .. }),
    );
}

#[test]
fn symlink_at_create_path_is_refused() {
    let t = "symlink_at_create_path_is_refused";
    // A dangling link: following it would create the target.
    let dangling = |d: &Path| {
        let path = d.join("f.cxc");
        symlink(d.join("target.cxc"), &path).unwrap();
        path
    };
    if let Some((dir, path)) = hostile(
        t,
        "dangling",
        dangling,
        create_test,
        "Symlink",
        |e| matches!(e, MmfError::Symlink { path } if path.ends_with("f.cxc")),
    ) {
        assert!(
            !dir.path().join("target.cxc").exists(),
            "symlink target was created"
        );
        assert_eq!(
            std::fs::read_link(&path).unwrap(),
            dir.path().join("target.cxc")
        );
        assert_eq!(
            entries(dir.path()),
            ["f.cxc"],
            "temporary files left behind"
        );
    }
    // A link to an existing file: the file must not change.
    let content = Rng::new(9).bytes(333);
    let to_file = {
        let content = content.clone();
        move |d: &Path| {
            std::fs::write(d.join("target.cxc"), &content).unwrap();
            let path = d.join("f.cxc");
            symlink(d.join("target.cxc"), &path).unwrap();
            path
        }
    };
    if let Some((dir, _)) = hostile(t, "to-file", to_file.clone(), create_test, "Symlink", |e| {
        matches!(e, MmfError::Symlink { .. })
    }) {
        assert_eq!(
            std::fs::read(dir.path().join("target.cxc")).unwrap(),
            content
        );
        assert_eq!(entries(dir.path()), ["f.cxc", "target.cxc"]);
    }
    let create_or_open = |path: &Path| {
        TestMap::create_or_open(
            path,
            layout(Kind::Test),
            &CreateOptions::default(),
            &expect(Kind::Test),
            |h, _| h[0].store(99, Ordering::Relaxed),
        )
    };
    if let Some((dir, _)) = hostile(
        t,
        "create-or-open",
        to_file,
        create_or_open,
        "Symlink",
        |e| matches!(e, MmfError::Symlink { .. }),
    ) {
        assert_eq!(
            std::fs::read(dir.path().join("target.cxc")).unwrap(),
            content
        );
    }
}

#[test]
fn create_on_existing_file_is_already_exists() {
    let t = "create_on_existing_file_is_already_exists";
    for (case, content) in [
        ("valid", None),
        ("garbage", Some(Rng::new(4).bytes(777))),
        ("empty", Some(Vec::new())),
    ] {
        let setup = {
            let content = content.clone();
            move |d: &Path| match content {
                None => valid(Kind::Test)(d),
                Some(bytes) => raw(bytes)(d),
            }
        };
        // The bytes before the child runs, captured by the parent below.
        let snapshot = std::cell::RefCell::new(Vec::new());
        let setup = |d: &Path| {
            let p = setup(d);
            *snapshot.borrow_mut() = std::fs::read(&p).unwrap();
            p
        };
        if let Some((dir, path)) = hostile(
            t,
            case,
            setup,
            create_test,
            "AlreadyExists",
            |e| matches!(e, MmfError::AlreadyExists { path } if path.ends_with("f.cxc")),
        ) {
            assert_eq!(
                std::fs::read(&path).unwrap(),
                *snapshot.borrow(),
                "existing file changed"
            );
            assert_eq!(
                entries(dir.path()),
                ["f.cxc"],
                "temporary files left behind"
            );
        }
    }
    let mkdir = |d: &Path| {
        let path = d.join("f.cxc");
        std::fs::create_dir(&path).unwrap();
        path
    };
    hostile(t, "dir", mkdir, create_test, "AlreadyExists", |e| {
        matches!(e, MmfError::AlreadyExists { .. })
    });
}

#[test]
fn create_mode_is_0600_by_default_and_exact_otherwise() {
    // Runs in a child with a restrictive umask, so "exact" means "not masked".
    let t = "create_mode_is_0600_by_default_and_exact_otherwise";
    let action = |dir: &Path| {
        rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
        let mut modes = Vec::new();
        for (name, mode) in [
            ("default", None),
            ("wide", Some(0o666)),
            ("group", Some(0o640)),
        ] {
            let path = dir.join(format!("{name}.cxc"));
            let mut opts = CreateOptions::default();
            if let Some(m) = mode {
                opts.mode = m;
            }
            drop(TestMap::create(&path, layout(Kind::Test), &opts, |_, _| {}).expect("create"));
            let got = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            modes.push(format!("{name}={got:o}"));
        }
        modes.join(" ")
    };
    in_child(
        t,
        "modes",
        |d| d.to_path_buf(),
        action,
        "default=600 wide=666 group=640",
    );
}

#[test]
fn peek_reads_a_valid_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.cxc");
    let m = make_valid(&path, Kind::Lease);
    let info = peek(&path).expect("peek a valid file");
    assert_eq!(info.layout, layout(Kind::Lease));
    assert_eq!(info.total_len, TOTAL);
    assert_eq!(info.creator_pid, std::process::id());
    assert_eq!(info.creator_start, cxc_mmf::identity::self_start_time());
    assert_eq!(&info, m.info());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), TOTAL);
}

#[test]
fn open_sees_creators_writes_and_shares_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.cxc");
    let a = make_valid(&path, Kind::Test);
    let b: TestMap = Mapped::open(&path, &expect(Kind::Test)).expect("open");
    assert_eq!(b.head()[0].load(Ordering::Acquire), 41);
    assert_eq!(b.slots().len() as u64, CAPACITY);
    a.slot(3).unwrap().fetch_add(10, Ordering::AcqRel);
    assert_eq!(b.slot(3).unwrap().load(Ordering::Acquire), 13);
    assert!(b.slot(CAPACITY as usize).is_none());
}
