//! Hostile conditions a test puts processes in: a cgroup v1 freezer group that stops a
//! process without a signal, descriptors used up to the limit, and the skip notices of
//! tests that need root, time namespaces or the freezer.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{find_program, wait_until};

/// The root of the cgroup v1 freezer hierarchy, where [`Freezer`] makes its groups.
pub const FREEZER: &str = "/sys/fs/cgroup/freezer";

/// Whether this process runs as root (effective user id 0).
///
/// ```
/// // Whoever runs it, the answer does not change between two calls.
/// assert_eq!(cxc_testkit::is_root(), cxc_testkit::is_root());
/// ```
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Prints `SKIPPED: <test>: <why>` to stdout and stderr (a skipped test has not passed,
/// and says so loudly) and returns `true`: what a `skip_without_*` check returns when
/// `test` must not run, so the test can `return` on it.
pub fn skip(test: &str, why: &str) -> bool {
    println!("SKIPPED: {test}: {why}");
    eprintln!("SKIPPED: {test}: {why}");
    true
}

/// Whether `test` must be skipped because it cannot make time namespaces here (it needs
/// root and a kernel with time namespaces); prints SKIPPED (see [`skip`]) if so.
pub fn skip_without_timens(test: &str) -> bool {
    if !is_root() {
        return skip(test, "needs root (time namespaces)");
    }
    if !Path::new("/proc/self/ns/time").exists() {
        return skip(test, "the kernel has no time namespaces");
    }
    false
}

/// [`skip_without_timens`] for a test that makes its time namespaces with the
/// `unshare(1)` program ([`find_program`]`("CXC_UNSHARE", "unshare")`): also skipped,
/// after the root check, if that program is not found.
pub fn skip_without_unshare_timens(test: &str) -> bool {
    if !is_root() {
        return skip(test, "needs root (time namespaces)");
    }
    if find_program("CXC_UNSHARE", "unshare").is_none() {
        return skip(test, "needs unshare(1) (time namespaces)");
    }
    skip_without_timens(test)
}

/// Whether `test` must be skipped because it cannot use the cgroup v1 freezer here (it
/// needs root and a [`FREEZER`] hierarchy); prints SKIPPED (see [`skip`]) if so.
pub fn skip_without_freezer(test: &str) -> bool {
    if !is_root() {
        return skip(test, "needs root (cgroup v1 freezer)");
    }
    if !Path::new(FREEZER).join("cgroup.procs").exists() {
        return skip(test, "no cgroup v1 freezer hierarchy");
    }
    false
}

/// A cgroup v1 freezer group of this test: [`Freezer::add`] moves processes into it,
/// [`Freezer::freeze`] stops them all without a signal (they show `D` in `/proc`, not
/// `T`), [`Freezer::thaw`] lets them run again. On drop it is thawed, its processes are
/// moved back to the root group and it is removed.
///
/// Needs root and a [`FREEZER`] hierarchy (see [`skip_without_freezer`]).
#[derive(Debug)]
pub struct Freezer {
    dir: PathBuf,
}

impl Freezer {
    /// Makes (or reuses) the group `cxc-<binary>-<pid>-<tag>` under [`FREEZER`]:
    /// `<binary>` is this test binary's name (without Cargo's hash), `<pid>` this
    /// process's id, so two binaries, or two runs, never share a group; `tag` tells the
    /// groups of one test apart.
    pub fn new(tag: &str) -> Freezer {
        let dir = Path::new(FREEZER).join(format!(
            "cxc-{}-{}-{tag}",
            binary_name(),
            std::process::id()
        ));
        let _ = std::fs::create_dir(&dir);
        Freezer { dir }
    }

    /// Moves process `pid` into the group (frozen at once if the group is).
    ///
    /// # Panics
    ///
    /// If the group's `cgroup.procs` cannot be written (no such group, no such process).
    pub fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// Freezes the group and waits (up to 5 s) until the kernel says `FROZEN`.
    ///
    /// # Panics
    ///
    /// If the state cannot be written or is not reached in time.
    pub fn freeze(&self) {
        self.set("FROZEN");
    }

    /// Thaws the group and waits (up to 5 s) until the kernel says `THAWED`.
    ///
    /// # Panics
    ///
    /// If the state cannot be written or is not reached in time.
    pub fn thaw(&self) {
        self.set("THAWED");
    }

    fn set(&self, state: &str) {
        std::fs::write(self.dir.join("freezer.state"), state).unwrap();
        let ok = wait_until(Duration::from_secs(5), || {
            std::fs::read_to_string(self.dir.join("freezer.state")).is_ok_and(|s| s.trim() == state)
        });
        assert!(ok, "freezer group did not reach {state}");
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("freezer.state"), "THAWED");
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.split_whitespace() {
                let _ = std::fs::write(Path::new(FREEZER).join("cgroup.procs"), p);
            }
        }
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// This executable's file name without the `-<hash>` Cargo appends to a test binary's
/// ([`without_cargo_hash`]); `test` if it cannot be read.
fn binary_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| {
            p.file_name()
                .map(|n| without_cargo_hash(&n.to_string_lossy()).to_owned())
        })
        .unwrap_or_else(|| "test".to_owned())
}

/// `name` less a trailing `-<hex digits>` (`attack44_mp-0123456789abcdef` gives
/// `attack44_mp`); `name` itself if it has none.
fn without_cargo_hash(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((stem, hash))
            if !stem.is_empty()
                && !hash.is_empty()
                && hash.chars().all(|c| c.is_ascii_hexdigit()) =>
        {
            stem
        }
        _ => name,
    }
}

/// Lowers this process's soft `RLIMIT_NOFILE` to `limit` (or the hard limit, if that is
/// lower) and opens `/dev/null` until the kernel says `EMFILE`; returns the descriptors
/// so taken: closing `n` of them leaves exactly `n` free.
///
/// Run it in a child process (a role): the lowered limit stays for the process's life.
///
/// # Panics
///
/// If the limit cannot be set or `/dev/null` fails to open for another reason.
pub fn use_up_fds(limit: u64) -> Vec<OwnedFd> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut rl = getrlimit(Resource::Nofile);
    // `None` is unlimited.
    rl.current = Some(rl.maximum.map_or(limit, |max| limit.min(max)));
    setrlimit(Resource::Nofile, rl).expect("setrlimit(RLIMIT_NOFILE)");
    let mut fds = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => fds.push(OwnedFd::from(f)),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => return fds,
            Err(e) => panic!("open /dev/null: {e}"),
        }
    }
}

/// Whether this process can still open a file (a descriptor is free).
///
/// ```
/// assert!(cxc_testkit::fd_free());
/// ```
pub fn fd_free() -> bool {
    std::fs::File::open("/dev/null").is_ok()
}

/// The root of the cgroup v1 pids hierarchy, where [`forbid_threads`] makes its groups.
pub const PIDS: &str = "/sys/fs/cgroup/pids";

/// Whether `test` must be skipped because it cannot limit threads with the cgroup v1
/// pids controller (it needs root and that hierarchy); prints SKIPPED if so.
pub fn skip_without_pids_cgroup(test: &str) -> bool {
    if !is_root() {
        return skip(test, "needs root (cgroup v1 pids controller)");
    }
    if !Path::new(PIDS).join("cgroup.procs").exists() {
        return skip(test, "no cgroup v1 pids hierarchy");
    }
    false
}

/// The pids group [`forbid_threads`] makes for process `pid`.
pub fn pids_group(pid: u32) -> PathBuf {
    Path::new(PIDS).join(format!("cxc-{}-{pid}", binary_name()))
}

/// Moves this process into a pids group of its own that allows no new task: from now
/// on no thread or process can be started (`EAGAIN`) until [`allow_threads`]. Panics
/// if the limit is not in force.
pub fn forbid_threads() {
    let group = pids_group(std::process::id());
    std::fs::create_dir(&group).expect("create the pids group");
    std::fs::write(group.join("pids.max"), "1").expect("set pids.max");
    std::fs::write(group.join("cgroup.procs"), std::process::id().to_string())
        .expect("join the pids group");
    assert!(
        std::thread::Builder::new().spawn(|| {}).is_err(),
        "the pids limit is not in force"
    );
}

/// Lifts the limit of [`forbid_threads`], moves this process back to the root group
/// and removes its group.
pub fn allow_threads() {
    let group = pids_group(std::process::id());
    let _ = std::fs::write(group.join("pids.max"), "max");
    let _ = std::fs::write(
        Path::new(PIDS).join("cgroup.procs"),
        std::process::id().to_string(),
    );
    let _ = std::fs::remove_dir(group);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_hash_is_dropped_from_a_binary_name() {
        assert_eq!(
            without_cargo_hash("attack44_mp-0123456789abcdef"),
            "attack44_mp"
        );
        assert_eq!(without_cargo_hash("attack44_mp"), "attack44_mp");
        assert_eq!(without_cargo_hash("cxc-cli"), "cxc-cli");
        assert_eq!(without_cargo_hash("-abc"), "-abc");
        assert!(!binary_name().is_empty());
    }
}
