//! Attack 16: hostile and mis-used files, with real processes: a `.cxc-tmp` file left by
//! a killed creator whose pid comes back; holder tables of zero slots; out-of-range header
//! parameters with a valid checksum; non-files and damaged files through every
//! primitive's `open` and `inspect`; fixed garbage in a live rwlock and cell file; and
//! `FencedFile` on foreign and oversized files.
//!
//! Every risky call runs in a child process (this test binary re-executed in a role,
//! `cxc_testkit::play_role!`), so that a panic, a fault (SIGBUS/SIGSEGV), an abort or a
//! hang is seen by the parent as a failed or killed child, within a bounded time, instead
//! of taking the test run down. The parent sides run one at a time (a file-wide lock).
#![cfg(not(cxc_loom))]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cxc_sync::{
    HeartbeatTable, OwnerLease, RwLockOptions, SemaphoreOptions, SharedCell, SharedRwLock,
    SharedSemaphore,
};
use cxc_testkit::{Proc, RoleCommand, fields, path_arg, play_role, report};

static SERIAL: Mutex<()> = Mutex::new(());

/// How long a child may take for everything it was asked to do.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);
/// How long a parent waits for one report.
const REPORT_WAIT: Duration = Duration::from_secs(20);

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

// ---------------------------------------------------------------------------------------
// Header surgery: the header is 128 bytes, its checksum (offset 120) is FNV-1a 64 over
// bytes 0..112 (docs/memory-layout.md). A hostile writer can recompute it, so that a
// damaged field reaches the primitive's own validation.
// ---------------------------------------------------------------------------------------

const OFF_CAPACITY: usize = 40;
const OFF_PARAMS: usize = 64;
const OFF_CHECKSUM: usize = 120;

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn read_header(path: &Path) -> [u8; 128] {
    let f = std::fs::File::open(path).unwrap();
    let mut h = [0u8; 128];
    f.read_exact_at(&mut h, 0).unwrap();
    h
}

fn put_u64(h: &mut [u8], at: usize, v: u64) {
    h[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// Rewrites the header of `path` with `edit` and a recomputed checksum. Leaves the file
/// length alone.
fn patch_header(path: &Path, edit: impl FnOnce(&mut [u8; 128])) {
    let mut h = read_header(path);
    edit(&mut h);
    let sum = fnv1a(&h[..112]);
    put_u64(&mut h, OFF_CHECKSUM, sum);
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&h, 0).unwrap();
}

/// Sets the header's slot count to `capacity` and the file length to match
/// (`128 + head_size + slot_size * capacity`), with a recomputed checksum.
fn set_capacity(path: &Path, capacity: u64) {
    let h = read_header(path);
    let head = u64::from(u32::from_ne_bytes(h[32..36].try_into().unwrap()));
    let slot = u64::from(u32::from_ne_bytes(h[36..40].try_into().unwrap()));
    let total = 128 + head + slot * capacity;
    patch_header(path, |h| {
        put_u64(h, OFF_CAPACITY, capacity);
        put_u64(h, 24, total);
    });
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(total)
        .unwrap();
}

fn set_param(path: &Path, i: usize, v: u64) {
    patch_header(path, |h| put_u64(h, OFF_PARAMS + 8 * i, v));
}

/// Runs role `role` of test `test` with `path`, and returns its reports; fails if the
/// child panics, faults, aborts or runs past `limit`.
fn run_child(test: &str, role: &str, path: &Path, limit: Duration) -> Vec<String> {
    let mut c: Proc = RoleCommand::new(test, role).arg("path", path).spawn();
    c.finish(limit)
}

// ---------------------------------------------------------------------------------------
// 1. A .cxc-tmp file left behind by a process killed during `create`.
// ---------------------------------------------------------------------------------------

// Found (fixed since): create_or_open fails with Io{op:"create"} (EEXIST on the temporary
// name) when a leftover `.NAME.cxc-tmp.<pid>.0` of a dead process with the same pid exists.
/// docs/memory-layout.md, "Init-state protocol": "A process killed during steps 2–5
/// leaves at most a `.cxc-tmp` file behind, never a partial file at the final path" and
/// "Exactly one of several racing processes gets `Origin::Created`". Such a leftover is
/// named after the dead creator's pid and counter; the pid comes back (pid reuse, and
/// every container's first process is pid 1), and the new process's first `create` uses
/// counter 0 again. The final path is empty, so `create`/`create_or_open` must create it.
///
/// The child plants the leftover under its own pid (what a killed creator with that pid
/// left, byte for byte: a temporary file of a lease being initialised), then creates.
#[test]
fn create_succeeds_over_a_leftover_tmp_file_of_a_dead_creator_with_the_same_pid() {
    fn role_creator() {
        let path = path_arg("path");
        let dir = path.parent().unwrap();
        let name = path.file_name().unwrap().to_str().unwrap();
        let leftover = dir.join(format!(".{name}.cxc-tmp.{}.0", std::process::id()));
        // A killed creator's temporary file: sized, header not yet ready.
        std::fs::write(&leftover, vec![0u8; 7680]).unwrap();
        let r = OwnerLease::<u64>::create_or_open(&path, 7, &Default::default());
        match r {
            Ok((l, origin)) => report(format!(
                "ok origin={origin:?} value={:?}",
                l.with_lease(std::process::id(), 3, |v| *v)
            )),
            Err(e) => report(format!("err {}", format!("{e:?}").replace('\n', " "))),
        }
    }
    play_role!(role_creator);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("job.lease");
    let reports = run_child(
        "create_succeeds_over_a_leftover_tmp_file_of_a_dead_creator_with_the_same_pid",
        "creator",
        &path,
        CHILD_DEADLINE,
    );
    assert_eq!(
        reports[0], "ok origin=Created value=Some(7)",
        "create_or_open of a missing path: {reports:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. Header fields out of range, with a valid checksum, through each primitive's `open`.
// ---------------------------------------------------------------------------------------

/// One line per attempt: `case=<name> result=<Ok|Err:<debug>>`.
fn describe<T, E: std::fmt::Debug>(r: Result<T, E>) -> String {
    match r {
        Ok(_) => "Ok".into(),
        Err(e) => format!("Err:{}", format!("{e:?}").replace([' ', '\n'], "")),
    }
}

/// Role `open_all`: opens each path of `paths` (separated by `;`) as `kind` and reports
/// `ms=<time> result=<Ok|Err:...>` for each, in order.
fn role_open_all() {
    let kind = cxc_testkit::arg("kind");
    for p in cxc_testkit::arg("paths").split(';') {
        let path = PathBuf::from(p);
        let t0 = Instant::now();
        let r = match kind.as_str() {
            "lease" => describe(OwnerLease::<u64>::open(&path)),
            "lease_inspect" => describe(cxc_sync::lease::inspect(&path)),
            "heartbeat" => describe(HeartbeatTable::open_any(&path)),
            "heartbeat_inspect" => describe(HeartbeatTable::inspect(&path)),
            "semaphore" => describe(SharedSemaphore::open(&path)),
            "semaphore_unregistered" => describe(SharedSemaphore::open_unregistered(&path)),
            "semaphore_inspect" => describe(SharedSemaphore::inspect(&path)),
            "rwlock" => describe(SharedRwLock::<u64>::open(&path)),
            "rwlock_inspect" => describe(SharedRwLock::<()>::inspect(&path)),
            "cell" => describe(SharedCell::<u64>::open(&path)),
            "cell_inspect" => describe(SharedCell::<()>::inspect(&path)),
            other => panic!("kind {other}"),
        };
        report(format!("ms={} result={r}", t0.elapsed().as_millis()));
    }
}

/// Opens every path of `paths` as `kind` in one child; returns `(milliseconds, result)`
/// for each. Fails if the child panics, faults, aborts or hangs.
fn open_in_child(test: &str, kind: &str, paths: &[PathBuf]) -> Vec<(u64, String)> {
    let joined: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let mut c = RoleCommand::new(test, "open_all")
        .arg("paths", joined.join(";"))
        .arg("kind", kind)
        .spawn();
    let reports = c.finish(CHILD_DEADLINE);
    assert_eq!(reports.len(), paths.len(), "{kind}: {reports:?}");
    reports
        .iter()
        .map(|r| {
            let f = fields(r);
            (f["ms"].parse().unwrap(), f["result"].to_owned())
        })
        .collect()
}

/// Creates a valid file of each kind in `dir`: `(kind, path)`.
fn valid_files(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let lease = dir.join("v.lease");
    drop(OwnerLease::<u64>::create(&lease, 1).unwrap());
    let hb = dir.join("v.hb");
    drop(HeartbeatTable::create(&hb, 2).unwrap());
    let sem = dir.join("v.sem");
    drop(
        SharedSemaphore::create_with(&sem, 1, 2, &SemaphoreOptions::default().holders(4)).unwrap(),
    );
    let rw = dir.join("v.rw");
    drop(SharedRwLock::<u64>::create_with(&rw, 1, &RwLockOptions::default().holders(4)).unwrap());
    let cell = dir.join("v.cell");
    drop(SharedCell::<u64>::create(&cell, 1).unwrap());
    vec![
        ("lease", lease),
        ("heartbeat", hb),
        ("semaphore", sem),
        ("rwlock", rw),
        ("cell", cell),
    ]
}

/// A copy of `src` at `dir/name`.
fn copy_to(src: &Path, dir: &Path, name: &str) -> PathBuf {
    let dst = dir.join(name);
    std::fs::copy(src, &dst).unwrap();
    dst
}

// ---------------------------------------------------------------------------------------
// 2. Holder tables of zero slots.
// ---------------------------------------------------------------------------------------

// Found (fixed since): a semaphore or rwlock file whose header says 0 holder slots (valid
// checksum) is accepted by `open_unregistered` and `inspect`, and `open` calls it
// `TableFull { capacity: 0 }` instead of a corrupt file.
/// docs/shared-semaphore.md, "Memory layout": "the holder capacity is the header's slot
/// count (1..=1023)"; docs/shared-rwlock.md: "The holder capacity is the header's slot
/// count (1..=1023)". `SharedSemaphore::open`'s doc: "`SemaphoreError::File` for a
/// missing, foreign, corrupt or incompatible file" (`TableFull` is "if every holder slot
/// belongs to a live process"). The heartbeat table, whose format also allows 0 slots,
/// refuses one with `ParamMismatch { name: "capacity" }` (docs/memory-layout.md: "Every
/// mismatch is its own error variant naming what was expected and found"; design.md:
/// "a truncated, empty, corrupt or foreign file is an error").
#[test]
fn zero_holder_slots_in_a_semaphore_or_rwlock_header_is_a_corrupt_file() {
    play_role!(role_open_all);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let t = "zero_holder_slots_in_a_semaphore_or_rwlock_header_is_a_corrupt_file";
    let files = valid_files(d.path());
    let mut bad = Vec::new();
    for (kind, src, opens) in [
        (
            "semaphore",
            &files[2].1,
            &["semaphore", "semaphore_unregistered", "semaphore_inspect"][..],
        ),
        ("rwlock", &files[3].1, &["rwlock", "rwlock_inspect"][..]),
        (
            "heartbeat",
            &files[1].1,
            &["heartbeat", "heartbeat_inspect"][..],
        ),
    ] {
        let p = copy_to(src, d.path(), &format!("{kind}.zero"));
        set_capacity(&p, 0);
        for open in opens {
            let (_, r) = open_in_child(t, open, std::slice::from_ref(&p)).remove(0);
            if !(r.contains("ParamMismatch") && r.contains("capacity")) {
                bad.push(format!("{open}: {r}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "0-slot files not refused as corrupt: {bad:#?}"
    );
}

// ---------------------------------------------------------------------------------------
// 3. Header parameters out of range, with a valid checksum.
// ---------------------------------------------------------------------------------------

/// docs/memory-layout.md, "Validation order" step 13: "primitive parameters (the kind's
/// `check_params`) → `ParamMismatch { name: <parameter> }`", and each primitive page's
/// parameter ranges (owner-lease.md: `[preemption, epoch mode, tick ns, 0]`, tick 1 µs..1
/// day; shared-semaphore.md: "`params[0]` = `max_permits` (1..=2^24−1), `params[1]` =
/// format version (2) ... `params[3]` = 0. `open` rejects anything else with
/// `MmfError::ParamMismatch`"; shared-rwlock.md: "A grace of 0, another version or a
/// non-zero `params[3]` is refused with `MmfError::ParamMismatch`"; shared-cell.md:
/// "another protocol is refused with `ParamMismatch { name: "cell_protocol" }` ... non-zero
/// reserved params with `ParamMismatch { name: "reserved" }`"; heartbeat: params[2] is
/// the heartbeat format version) and capacity limits (step 11). Each open runs in a child:
/// no panic, no fault, an answer at once.
#[test]
fn out_of_range_header_params_with_a_valid_checksum_are_param_mismatch() {
    /// (open kind, edits as (param index, or `usize::MAX` for the capacity, value),
    /// expected parameter name).
    type Case<'a> = (&'a str, &'a [(usize, u64)], &'a str);
    play_role!(role_open_all);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let t = "out_of_range_header_params_with_a_valid_checksum_are_param_mismatch";
    let files = valid_files(d.path());
    let src = |k: &str| files.iter().find(|(n, _)| *n == k).unwrap().1.clone();
    let day_ns = 86_400_000_000_000u64;
    let cases: &[Case] = &[
        ("lease", &[(0, 2)], "preemption"),
        ("lease", &[(0, u64::MAX)], "preemption"),
        ("lease", &[(1, 1), (2, 0)], "epoch_mode"),
        ("lease", &[(1, 1), (2, 999)], "epoch_mode"),
        ("lease", &[(1, 1), (2, day_ns + 1)], "epoch_mode"),
        ("lease", &[(1, 0), (2, 5)], "epoch_mode"),
        ("lease", &[(1, 2), (2, 1_000)], "epoch_mode"),
        ("lease", &[(3, 1)], "reserved"),
        ("heartbeat", &[(0, 1), (1, 0)], "epoch_mode"),
        ("heartbeat", &[(0, 1), (1, u64::MAX)], "epoch_mode"),
        ("heartbeat", &[(2, 1)], "heartbeat_protocol"),
        ("heartbeat", &[(3, 9)], "reserved_param"),
        ("heartbeat", &[(usize::MAX, 65_537)], "capacity"),
        ("semaphore", &[(0, 0)], "max_permits"),
        ("semaphore", &[(0, 1 << 24)], "max_permits"),
        ("semaphore", &[(0, u64::MAX)], "max_permits"),
        ("semaphore", &[(1, 1)], "protocol"),
        ("semaphore", &[(3, 1)], "reserved param 3"),
        ("semaphore", &[(usize::MAX, 1024)], "capacity"),
        ("rwlock", &[(0, 0)], "grace_ns"),
        ("rwlock", &[(1, 1)], "protocol"),
        ("rwlock", &[(3, 1)], "reserved param 3"),
        ("rwlock", &[(usize::MAX, 1024)], "capacity"),
        ("cell", &[(0, 1)], "cell_protocol"),
        ("cell", &[(0, u64::MAX)], "cell_protocol"),
        ("cell", &[(2, 1)], "reserved"),
    ];
    let mut by_kind: Vec<(&str, Vec<PathBuf>, Vec<&str>)> = Vec::new();
    for (i, (kind, edits, name)) in cases.iter().enumerate() {
        let p = copy_to(&src(kind), d.path(), &format!("case{i}.{kind}"));
        for &(at, v) in *edits {
            if at == usize::MAX {
                set_capacity(&p, v);
            } else {
                set_param(&p, at, v);
            }
        }
        match by_kind.iter_mut().find(|(k, _, _)| k == kind) {
            Some((_, ps, ns)) => {
                ps.push(p);
                ns.push(name);
            }
            None => by_kind.push((kind, vec![p], vec![name])),
        }
    }
    let mut bad = Vec::new();
    for (kind, paths, names) in &by_kind {
        for (j, (ms, r)) in open_in_child(t, kind, paths).into_iter().enumerate() {
            // `describe` drops spaces.
            let want = format!("ParamMismatch{{name:\"{}\"", names[j].replace(' ', ""));
            if !r.contains(&want) || ms > 1_000 {
                bad.push(format!("{kind} {}: {ms} ms {r}", paths[j].display()));
            }
        }
    }
    assert!(bad.is_empty(), "not refused as documented: {bad:#?}");
}

// ---------------------------------------------------------------------------------------
// 4. Things that are not cxc files, or damaged ones, at the path.
// ---------------------------------------------------------------------------------------

/// docs/memory-layout.md, "Validation order": missing → `NotFound`; a directory →
/// `NotAFile`; "a FIFO does not block the open"; FIFO, device → `NotAFile`; length < 128 →
/// `TooShort`; wrong magic → `BadMagic`; wrong version → `UnsupportedVersion`; wrong kind
/// → `WrongKind`; file length ≠ `TOTAL_LEN` → `WrongLength`; otherwise `Io { op: "open" }`
/// (a symlink loop). design.md: "A truncated, empty, corrupt or foreign file is an error,
/// never SIGBUS ..., never a panic, never UB." Every primitive's `open` and read-only
/// `inspect`, each in a child (bounded: 60 s for all; each answer at once).
#[test]
fn hostile_paths_give_the_documented_error_through_every_primitive() {
    play_role!(role_open_all);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let t = "hostile_paths_give_the_documented_error_through_every_primitive";
    let dir = d.path();
    let files = valid_files(dir);
    let missing = dir.join("missing");
    let subdir = dir.join("subdir");
    std::fs::create_dir(&subdir).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let loop_a = dir.join("loop_a");
    std::os::unix::fs::symlink(dir.join("loop_b"), &loop_a).unwrap();
    std::os::unix::fs::symlink(&loop_a, dir.join("loop_b")).unwrap();
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    let short = dir.join("short");
    std::fs::write(&short, [0x43u8; 100]).unwrap();
    let random = dir.join("random");
    let mut rng = cxc_testkit::Rng::for_test();
    let bytes: Vec<u8> = (0..8192).map(|_| rng.next_u64() as u8).collect();
    std::fs::write(&random, bytes).unwrap();
    let mut bad = Vec::new();
    for (i, (kind, valid)) in files.iter().enumerate() {
        // Another kind's valid file, and this kind's file damaged.
        let other = &files[(i + 1) % files.len()].1;
        let longer = copy_to(valid, dir, &format!("{kind}.longer"));
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&longer)
            .unwrap();
        f.set_len(f.metadata().unwrap().len() + 1).unwrap();
        let shorter = copy_to(valid, dir, &format!("{kind}.shorter"));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&shorter)
            .unwrap();
        f.set_len(f.metadata().unwrap().len() - 8).unwrap();
        let header_only = copy_to(valid, dir, &format!("{kind}.header"));
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&header_only)
            .unwrap();
        f.set_len(128).unwrap();
        let v9 = copy_to(valid, dir, &format!("{kind}.v9"));
        patch_header(&v9, |h| h[8..12].copy_from_slice(&9u32.to_ne_bytes()));
        let cases: Vec<(PathBuf, &str)> = vec![
            (missing.clone(), "NotFound"),
            (subdir.clone(), "NotAFile"),
            (fifo.clone(), "NotAFile"),
            (PathBuf::from("/dev/null"), "NotAFile"),
            (loop_a.clone(), "Io{op:\"open\""),
            (empty.clone(), "TooShort"),
            (short.clone(), "TooShort"),
            (random.clone(), "BadMagic"),
            (other.clone(), "WrongKind"),
            (longer, "WrongLength"),
            (shorter, "WrongLength"),
            (header_only, "WrongLength"),
            (v9, "UnsupportedVersion"),
        ];
        let paths: Vec<PathBuf> = cases.iter().map(|(p, _)| p.clone()).collect();
        for open in [kind.to_string(), format!("{kind}_inspect")] {
            for (j, (ms, r)) in open_in_child(t, &open, &paths).into_iter().enumerate() {
                if !r.contains(cases[j].1) || ms > 1_000 {
                    bad.push(format!("{open} {}: {ms} ms {r}", paths[j].display()));
                }
            }
        }
    }
    assert!(bad.is_empty(), "not the documented error: {bad:#?}");
}

// ---------------------------------------------------------------------------------------
// 5. A live file set to fixed garbage by another process while a victim process has it
//    open. (The rwlock and the cell are not among the fuzz targets, docs/RELIABILITY.md
//    "Fuzzing"; the random vandals of attack2_mp change words every ~50 µs, while a state
//    left by a crash or a bad writer stays put.)
// ---------------------------------------------------------------------------------------

/// Offset of the primitive's fixed block in the file.
const BODY: u64 = 128;

/// One damage: words (file offset, value) written together.
type Damage = Vec<(u64, u64)>;

/// Waits (polling) for `path`; false after `limit`.
fn wait_path(path: &Path, limit: Duration) -> bool {
    cxc_testkit::wait_for_path(path, limit)
}

/// Victim side: for each step `n` the parent announces with file `go-n` in `dir` (the
/// file damaged by then), runs `ops` (each op timed) and reports `done=n op=<slowest>
/// ms=<its time>`; stops at file `stop`.
fn victim_loop(dir: &Path, mut ops: impl FnMut(&mut dyn FnMut(&'static str, &mut dyn FnMut()))) {
    report("ready");
    for n in 0.. {
        let go = dir.join(format!("go-{n}"));
        loop {
            if wait_path(&go, Duration::from_millis(200)) {
                break;
            }
            if dir.join("stop").exists() {
                return;
            }
        }
        let mut slowest = ("none", Duration::ZERO);
        let mut time = |name: &'static str, f: &mut dyn FnMut()| {
            let t0 = Instant::now();
            f();
            let e = t0.elapsed();
            if e > slowest.1 {
                slowest = (name, e);
            }
        };
        ops(&mut time);
        report(format!(
            "done={n} op={} ms={}",
            slowest.0,
            slowest.1.as_millis()
        ));
    }
}

/// Parent side: starts the victim (role `role`), and for each damage writes its words
/// into the live file, lets the victim run its operations, checks that it answered
/// within `limit` per operation (a hang fails the test after 15 s with the damage
/// named), then puts the file's bytes back as they were when the victim was ready.
fn sweep(test: &str, role: &str, path: &Path, dir: &Path, damages: &[Damage], limit: Duration) {
    let mut victim = RoleCommand::new(test, role)
        .arg("path", path)
        .arg("dir", dir)
        .spawn();
    assert_eq!(victim.next_report(REPORT_WAIT), "ready");
    let pristine = std::fs::read(path).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut slow = Vec::new();
    for (n, damage) in damages.iter().enumerate() {
        for &(off, v) in damage {
            f.write_all_at(&v.to_ne_bytes(), off).unwrap();
        }
        println!("step {n}: damage {damage:x?}");
        std::fs::write(dir.join(format!("go-{n}")), b"").unwrap();
        // A hang or a crash of the victim fails here, with its output (the damage is the
        // last "step" line printed above).
        let r = victim.next_report(Duration::from_secs(15));
        let fl = fields(&r);
        assert_eq!(fl["done"], n.to_string(), "{r}");
        let ms: u64 = fl["ms"].parse().unwrap();
        if Duration::from_millis(ms) > limit {
            slow.push(format!("damage {damage:x?}: {} took {ms} ms", fl["op"]));
        }
        f.write_all_at(&pristine, 0).unwrap();
    }
    std::fs::write(dir.join("stop"), b"").unwrap();
    victim.finish(CHILD_DEADLINE);
    assert!(
        slow.is_empty(),
        "{role}: operations past {limit:?}: {slow:#?}"
    );
}

/// The same value at each of `offsets`, one damage each, for each of `values`.
fn each(offsets: &[u64], values: &[u64]) -> Vec<Damage> {
    let mut v = Vec::new();
    for &o in offsets {
        for &x in values {
            v.push(vec![(o, x)]);
        }
    }
    v
}

const NASTY: &[u64] = &[
    u64::MAX,
    0x8000_0000_0000_0000,
    0x0000_0000_ffff_ffff,
    0x5555_5555_5555_5555,
    1,
    0x3ff,
];

/// docs/shared-rwlock.md: "Contention is not an error: `try_*` and `*_timeout` return
/// `Option`"; a dead or stale writer is evicted and "never blocks the lock forever";
/// docs/design.md: "Values read from the file after open are never trusted for memory
/// access: every index is bounds-checked against the validated layout"; docs/RELIABILITY.md
/// "Fuzzing": "using that handle must neither panic, nor fault, nor hang". With every word
/// of the state the protocol decides on set to fixed garbage in the live file (the state
/// word, progress counter, futex words, `hwm`, quarantine records, holder slots, the
/// strategy and ring heads), a victim process's `try_read`, `read_timeout(30 ms)`,
/// `try_write`, `write_timeout(30 ms)` (and the write guard's `read`, `write`, `update`,
/// `beat`, `unlock`), `reclaim_dead`, `stats` and `inspect` each return within 1 s, and
/// the victim neither panics nor faults.
#[test]
fn rwlock_fixed_garbage_in_a_live_file_never_panics_faults_or_hangs() {
    fn role_victim() {
        let path = path_arg("path");
        let dir = path_arg("dir");
        let lock = SharedRwLock::<u64>::open(&path).unwrap();
        // A write first, so this process has used every path once.
        let _ = lock.try_write().map(|w| w.write(5));
        let ms30 = Duration::from_millis(30);
        let mut i = 0u64;
        victim_loop(&dir, |time| {
            i += 1;
            time("try_read", &mut || {
                let _ = lock.try_read().map(|r| r.get());
            });
            time("read_timeout", &mut || {
                let _ = lock.read_timeout(ms30).map(|r| r.get());
            });
            time("try_write+guard ops", &mut || {
                if let Some(w) = lock.try_write() {
                    let _ = (w.read(), w.write(i), w.update(|v| *v += 1), w.beat());
                    let _ = (w.token(), w.is_current(), w.unlock());
                }
            });
            time("write_timeout+guard ops", &mut || {
                if let Some(w) = lock.write_timeout(ms30) {
                    let _ = (w.write(i), w.read());
                    drop(w);
                }
            });
            time("reclaim_dead", &mut || {
                let _ = lock.reclaim_dead();
            });
            time("stats", &mut || {
                let _ = (lock.stats(), lock.counters(), lock.current_token());
            });
            time("inspect", &mut || {
                let _ = SharedRwLock::<()>::inspect(&path);
            });
        });
    }
    play_role!(role_victim);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("rw");
    drop(SharedRwLock::<u64>::create_with(&path, 1, &RwLockOptions::default().holders(4)).unwrap());
    let w = |slot: u64, pubb: u64, stage: u64, q: u64, token: u64| {
        slot | pubb << 10 | stage << 13 | q << 16 | token << 24
    };
    let mut damages = each(
        &[128, 136, 144, 152, 160, 192, 200, 248, 1024, 960, 968],
        NASTY,
    );
    // State words naming the creator's slot (live), the victim's, slots beyond the
    // table, every buffer quarantined, staging = published.
    for v in [
        w(1, 0, 1, 0, 7),
        w(2, 0, 1, 0, 7),
        w(4, 0, 1, 0, 7),
        w(5, 0, 1, 0, 7),
        w(1023, 3, 3, 0, 7),
        w(0, 0, 0, 0xff, 7),
        w(0, 2, 2, 0xfe, 7),
        w(2, 1, 1, 0xff, (1 << 40) - 1),
    ] {
        damages.push(vec![(128, v)]);
    }
    // Holder slots: owner and read-count words of each of the 4 slots.
    let slots: Vec<u64> = (0..4)
        .flat_map(|i| [3584 + 64 * i, 3592 + 64 * i])
        .collect();
    damages.extend(each(&slots, NASTY));
    // A read hold counted in a free slot, and in every slot at once.
    damages.push(vec![(3584 + 64 * 3, 0), (3592 + 64 * 3, 1)]);
    damages.push((0..4).map(|i| (3592 + 64 * i, 1)).collect());
    sweep(
        "rwlock_fixed_garbage_in_a_live_file_never_panics_faults_or_hangs",
        "victim",
        &path,
        d.path(),
        &damages,
        Duration::from_secs(1),
    );
}

/// docs/shared-cell.md: "`load() -> T` | never blocks, never torn"; "A writer that is
/// SIGKILLed or SIGSTOPped mid-store never exposes its bytes and never wedges the cell";
/// docs/seqlock.md: a 33rd writer "gets `NoWriterSlot`"; docs/design.md: every index read
/// from the file is bounds-checked. With the published word, the update claim, the writer
/// slots' state and identity words, the strategy and the ring heads set to fixed garbage
/// in the live file, a victim process's `load`, `store`, `update` (stall timeout 10 ms),
/// `counters` and `inspect` each return within 1 s, without a panic or a fault.
#[test]
fn cell_fixed_garbage_in_a_live_file_never_panics_faults_or_hangs() {
    fn role_victim() {
        let path = path_arg("path");
        let dir = path_arg("dir");
        let cell = SharedCell::<u64>::open(&path).unwrap();
        cell.store(5).unwrap();
        let mut i = 0u64;
        victim_loop(&dir, |time| {
            i += 1;
            time("load", &mut || {
                let _ = cell.load();
            });
            time("store", &mut || {
                let _ = cell.store(i);
            });
            time("update", &mut || {
                let _ = cell.update(|v| *v = v.wrapping_add(1));
            });
            time("load again", &mut || {
                let _ = cell.load();
            });
            time("counters", &mut || {
                let _ = cell.counters();
            });
            time("inspect", &mut || {
                let _ = SharedCell::<()>::inspect(&path);
            });
        });
    }
    play_role!(role_victim);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("cell");
    drop(SharedCell::<u64>::create(&path, 1).unwrap());
    // pub_word, claim, writer slots 0, 1 and 31 (state and identity), handshake, ring.
    let slot = |i: u64| BODY + 256 + 64 * i;
    let mut offsets = vec![BODY, BODY + 64, BODY + 6400, BODY + 6464, BODY + 6472];
    for i in [0, 1, 31] {
        offsets.extend((0..5).map(|k| slot(i) + 8 * k));
    }
    let mut damages = each(&offsets, NASTY);
    for c in [0x80, 0x20, 0x21, 0xff, 0x1_02, 0x1_81] {
        damages.push(vec![(BODY + 64, c)]);
    }
    for p in [0x3f, 0x40, 0x41, 0xff, (1 << 8) | 1] {
        damages.push(vec![(BODY, p)]);
    }
    // Every writer slot BUSY, or VALID naming garbage identities.
    damages.push((0..32).map(|i| (slot(i), 1)).collect());
    damages.push((0..32).map(|i| (slot(i), 2)).collect());
    damages.push(
        (0..32)
            .flat_map(|i| [(slot(i), 2), (slot(i) + 8, u64::MAX)])
            .collect(),
    );
    sweep(
        "cell_fixed_garbage_in_a_live_file_never_panics_faults_or_hangs",
        "victim",
        &path,
        d.path(),
        &damages,
        Duration::from_secs(1),
    );
}

// ---------------------------------------------------------------------------------------
// 6. FencedFile (docs/leader-election.md) on files that are not fenced files.
// ---------------------------------------------------------------------------------------

/// Role `fenced`: `FencedFile::open` and `read` of each of `paths`; reports
/// `result=<Ok(mark,len)|Err:...>` for each.
fn role_fenced() {
    use cxc_sync::{FencedFile, FencedResource};
    for p in cxc_testkit::arg("paths").split(';') {
        let r = FencedFile::open(p).and_then(|f| f.read());
        let r = match r {
            Ok((mark, data)) => format!("Ok({mark},{})", data.len()),
            Err(e) => format!("Err:{}", format!("{e:?}").replace([' ', '\n'], "")),
        };
        report(format!("result={r}"));
    }
}

/// docs/leader-election.md: "Errors are typed: ... `FencedFileError::{Io, NotFenced}`";
/// `FencedFile::open`'s doc: "a symlink at `path` is refused", "`NotFenced` for a file of
/// something else". A directory, a FIFO, a symlink, a short file and a cxc lease file give
/// an error (the lease file is left unchanged), in a child that must not panic or hang.
#[test]
fn fenced_file_refuses_paths_that_are_not_fenced_files() {
    play_role!(role_fenced);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let fifo = dir.join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let target = dir.join("target");
    std::fs::write(&target, b"").unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let short = dir.join("short");
    std::fs::write(&short, b"CXCFE").unwrap();
    let lease = dir.join("lease");
    drop(OwnerLease::<u64>::create(&lease, 1).unwrap());
    let before = std::fs::read(&lease).unwrap();
    let cases = [
        (&sub, "Io"),
        (&fifo, "Err:"),
        (&link, "Io"),
        (&short, "NotFenced"),
        (&lease, "NotFenced"),
    ];
    let joined: Vec<String> = cases.iter().map(|(p, _)| p.display().to_string()).collect();
    let reports = RoleCommand::new(
        "fenced_file_refuses_paths_that_are_not_fenced_files",
        "fenced",
    )
    .arg("paths", joined.join(";"))
    .spawn()
    .finish(CHILD_DEADLINE);
    let mut bad = Vec::new();
    for (i, (p, want)) in cases.iter().enumerate() {
        let r = fields(&reports[i])["result"].to_owned();
        if !r.starts_with("Err:") || !r.contains(want) {
            bad.push(format!("{}: {r}", p.display()));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
    assert_eq!(
        std::fs::read(&lease).unwrap(),
        before,
        "the lease file was changed"
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        b"",
        "the symlink was followed"
    );
}

// Found (fixed since): `read` of a fenced file whose length a hostile process set to 1 TiB
// (sparse) aborts the process ("memory allocation ... failed", SIGABRT).
/// docs/leader-election.md: "Errors are typed: ... `FencedFileError::{Io, NotFenced}`";
/// docs/design.md: a corrupt or foreign file "is an error, never ... a panic". A fenced
/// file is a plain file any process with write access can extend; `read` sizes its buffer
/// from the file length without a bound, so it must answer with an error (or the data),
/// not end the process.
#[test]
fn fenced_file_read_of_a_file_extended_to_a_terabyte_does_not_abort() {
    play_role!(role_fenced);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("state");
    {
        use cxc_sync::{FencedFile, FencedResource};
        let f = FencedFile::open(&path).unwrap();
        assert!(f.write(3, b"data").unwrap());
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let mut c = RoleCommand::new(
        "fenced_file_read_of_a_file_extended_to_a_terabyte_does_not_abort",
        "fenced",
    )
    .arg("paths", &path)
    .spawn();
    let out = c.output(CHILD_DEADLINE);
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.success(),
        "FencedFile::read of a 1 TiB file: status {:?} (signal {:?}); stderr: {}",
        out.status,
        out.status.signal(),
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| !l.trim_start().starts_with("at ") && !l.contains(": 0x"))
            .take(8)
            .collect::<Vec<_>>()
            .join(" | ")
    );
}
