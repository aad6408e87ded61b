//! `inspect` and `watch` read files without writing them: as an unprivileged user on
//! 0644 files owned by root, and on a read-only bind mount, every kind is shown (with the
//! holders' command lines and claim times) and every file's bytes and mtime stay the same.
//!
//! These tests need root (to switch to an unprivileged user, to mount); run as another
//! user they print why and return.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use rustix::process::{Pid, Signal};

const CXC: &str = env!("CARGO_BIN_EXE_cxc");

mod common;
use common::{cxc, p, succeeds};

/// True when this process is root; otherwise prints that the test is skipped and why it
/// needs root.
fn root_or_skip(why: &str) -> bool {
    let root = rustix::process::geteuid().is_root();
    if !root {
        println!("skipped: needs root ({why})");
    }
    root
}

/// A started `run` wrapper whose keeper is stopped once it holds the claim (so nothing
/// writes the file any more), resumed and killed at the end.
struct Held {
    wrapper: Child,
    keeper: Pid,
}

impl Drop for Held {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process(self.keeper, Signal::CONT);
        let _ = rustix::process::kill_process(
            Pid::from_raw(self.wrapper.id() as i32).unwrap(),
            Signal::TERM,
        );
        let _ = self.wrapper.wait();
    }
}

fn inspect_json(path: &Path) -> serde_json::Value {
    let o = cxc(&["inspect", "--json", p(path)]).output().unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null)
}

/// Starts `cxc ARGS -- sleep 60` and waits until `holder(json of PATH)` names its keeper.
fn hold(args: &[&str], path: &Path, holder: impl Fn(&serde_json::Value) -> Option<u64>) -> Held {
    let mut all = args.to_vec();
    all.extend(["--", "sleep", "60"]);
    let mut wrapper = cxc(&all).spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        if let Some(pid) = holder(&inspect_json(path)) {
            break pid;
        }
        if Instant::now() >= end {
            let _ = wrapper.kill();
            let _ = wrapper.wait();
            panic!("{args:?} never held {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let keeper = Pid::from_raw(pid as i32).unwrap();
    rustix::process::kill_process(keeper, Signal::STOP).unwrap();
    // A beat in flight when the keeper stopped has landed by now.
    std::thread::sleep(Duration::from_millis(50));
    Held { wrapper, keeper }
}

/// One file of every kind `inspect` reads, in `dir`, with live holders that no longer
/// write (stopped keepers, a read lock of this process).
struct Fixture {
    files: Vec<PathBuf>,
    lease_keeper: Pid,
    sem_keeper: Pid,
    _held: Vec<Held>,
    _rwlock: cxc::SharedRwLock<u64>,
}

fn fixture(dir: &Path) -> Fixture {
    let (l, s, h, c, r) = (
        dir.join("l"),
        dir.join("s"),
        dir.join("h"),
        dir.join("c"),
        dir.join("r"),
    );
    let lease = hold(&["lease", "run", p(&l)], &l, |v| {
        v["state"]["owner"].as_u64()
    });
    let sem = hold(&["sem", "run", p(&s), "--permits", "3"], &s, |v| {
        v["state"]["holders"]
            .as_array()?
            .iter()
            .find(|h| h["held"].as_u64() == Some(1))?["pid"]
            .as_u64()
    });
    succeeds(&["create", "heartbeat", p(&h), "--capacity", "4"]);
    succeeds(&["create", "cell", p(&c), "--value", "0a0b0c"]);
    let rw = cxc::SharedRwLock::<u64>::create(&r, 77).unwrap();
    std::mem::forget(rw.read());
    Fixture {
        files: vec![l, s, h, c, r],
        lease_keeper: lease.keeper,
        sem_keeper: sem.keeper,
        _held: vec![lease, sem],
        _rwlock: rw,
    }
}

/// Each file's bytes and modification time.
fn state(files: &[PathBuf]) -> Vec<(Vec<u8>, SystemTime)> {
    files
        .iter()
        .map(|f| {
            let m = std::fs::metadata(f).unwrap();
            (std::fs::read(f).unwrap(), m.modified().unwrap())
        })
        .collect()
}

/// Checks the text report of the fixture's files.
fn check_report(fx: &Fixture, o: &Output) {
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "inspect failed: {err}\n{out}");
    for kind in ["lease ", "semaphore ", "heartbeat ", "cell ", "rwlock "] {
        assert!(out.contains(kind), "no {kind}report:\n{out}");
    }
    let lk = fx.lease_keeper.as_raw_nonzero();
    assert!(
        out.contains(&format!("owner:       pid {lk} [alive]")),
        "lease owner:\n{out}"
    );
    assert!(
        out.contains("command:     ") && out.contains("lease run") && out.contains("sleep 60"),
        "holder command line:\n{out}"
    );
    assert!(out.contains("since:       epoch "), "claim time:\n{out}");
    assert!(out.contains("held for "), "claim age:\n{out}");
    let sk = fx.sem_keeper.as_raw_nonzero();
    assert!(
        out.contains(&format!("pid {sk:>8} [alive]  holds 1")),
        "semaphore holder:\n{out}"
    );
    let me = std::process::id();
    assert!(
        out.contains(&format!("pid {me:>8} [alive]  read holds 1")),
        "rwlock reader:\n{out}"
    );
    assert!(
        out.contains("value:       4d00000000000000 (8 bytes"),
        "{out}"
    );
    assert!(out.contains("value:       0a0b0c"), "cell value:\n{out}");
}

#[test]
fn inspect_and_watch_work_as_an_unprivileged_user_on_0644_files() {
    if !root_or_skip("to run inspect as user nobody on root's files") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let fx = fixture(d.path());
    for f in &fx.files {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let before = state(&fx.files);
    let nobody = |args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", CXC])
            .args(args)
            .stdin(Stdio::null());
        c
    };
    let mut args = vec!["inspect"];
    args.extend(fx.files.iter().map(|f| p(f)));
    check_report(&fx, &nobody(&args).output().unwrap());
    args.insert(1, "--json");
    let o = nobody(&args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), fx.files.len());
    assert!(lines[0]["state"]["claimed_epoch"].as_u64().is_some());
    assert!(
        lines[0]["state"]["owner_cmdline"]
            .as_str()
            .is_some_and(|c| c.contains("sleep 60"))
    );
    // watch, as nobody too: plain reports (not a terminal) until killed.
    let mut w = nobody(&["watch", "--interval", "100ms", p(&fx.files[0])])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    assert!(w.try_wait().unwrap().is_none(), "watch exited early");
    w.kill().unwrap();
    let out = w.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.matches("owner:").count() >= 2,
        "watch redraws:\n{text}"
    );
    assert_eq!(
        state(&fx.files),
        before,
        "a file changed under inspect/watch"
    );
}

/// Unmounts on drop.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn inspect_works_on_a_read_only_bind_mount() {
    if !root_or_skip("to make a read-only bind mount") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let (src, mnt) = (d.path().join("src"), d.path().join("mnt"));
    std::fs::create_dir(&src).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let fx = fixture(&src);
    if !Command::new("mount")
        .args(["--bind", p(&src), p(&mnt)])
        .status()
        .is_ok_and(|s| s.success())
    {
        println!("skipped: mount --bind failed (no mount privilege here)");
        return;
    }
    let m = Mount(mnt.clone());
    assert!(
        Command::new("mount")
            .args(["-o", "remount,ro,bind", p(&mnt)])
            .status()
            .unwrap()
            .success()
    );
    // The mount is read-only indeed.
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("l"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc_erofs()), "{err}");
    let files: Vec<PathBuf> = fx
        .files
        .iter()
        .map(|f| mnt.join(f.file_name().unwrap()))
        .collect();
    let before = state(&files);
    let mut args = vec!["inspect"];
    args.extend(files.iter().map(|f| p(f)));
    check_report(&fx, &cxc(&args).output().unwrap());
    assert_eq!(state(&files), before, "a file changed under inspect");
    drop(m);
}

/// `EROFS`.
fn libc_erofs() -> i32 {
    rustix::io::Errno::ROFS.raw_os_error()
}
