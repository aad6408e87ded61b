//! Pid-reuse support for the identity tests, on top of `cxc_testkit`: runs a scenario as
//! pid 1 of a fresh pid namespace (with its own `/proc`), and starts a child with a chosen
//! pid (`/proc/sys/kernel/ns_last_pid`), so a dead process's pid can be handed to a new
//! process on purpose.
//!
//! Roles are `cxc_testkit` roles; every child gets the scenario directory as role
//! argument `dir` and reports on stdout (`cxc_testkit::report`).
#![allow(dead_code, unreachable_pub, unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use cxc_testkit::{Proc, RoleCommand, path_arg};

// Not every test that includes this module uses them.
#[allow(unused_imports)]
pub use cxc_testkit::{report, role};

/// How long a scenario (or a child's report) may take.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// The shared directory of a scenario.
pub fn dir() -> PathBuf {
    path_arg("dir")
}

/// Whether this process may make pid namespaces and write `ns_last_pid`.
pub use cxc_testkit::is_root;

/// Prints the skip notice of a test that needs root (and says so loudly: a skipped test
/// has not passed).
pub fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    println!("SKIPPED: needs root ({test}: pid namespaces and ns_last_pid)");
    eprintln!("SKIPPED: needs root ({test}: pid namespaces and ns_last_pid)");
    true
}

/// Re-executes this binary running only `test`, in `role`, in scenario directory `dir`,
/// with role arguments `args`.
pub fn spawn(test: &str, role: &str, dir: &Path, args: &[(&str, &str)]) -> Proc {
    args.iter()
        .fold(
            RoleCommand::new(test, role).arg("dir", dir),
            |cmd, (k, v)| cmd.arg(k, v),
        )
        .spawn()
}

/// Runs `test` in role `scenario` as pid 1 of a new pid namespace (through a helper in
/// role `nsroot` that unshares the namespace for its children), with the extra
/// environment `env`; panics with the scenario's output if it fails.
pub fn run_in_new_pidns(test: &str, dir: &Path, env: &[(&str, &str)]) {
    let cmd = env.iter().fold(
        RoleCommand::new(test, "nsroot").arg("dir", dir),
        |cmd, (k, v)| cmd.env(k, v),
    );
    let out = cmd.spawn().output(DEADLINE);
    assert!(
        out.status.success(),
        "the scenario failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The parent side of a pid-reuse test: says SKIPPED unless root, else runs `test`'s
/// scenario in a new pid namespace and a fresh directory, on the fallback identity path
/// (pid + start time) if `fallback`.
pub fn run_reuse_test(test: &str, fallback: bool) {
    if skip_unless_root(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let env: &[(&str, &str)] = if fallback {
        &[("CXC_IDENTITY_FALLBACK", "1")]
    } else {
        &[]
    };
    run_in_new_pidns(test, dir.path(), env);
}

/// Role `nsroot`: makes a new pid namespace for its children, runs `scenario` in it
/// (with this process's environment and output: scenario directory and flags) and exits
/// with its status. After the unshare this process cannot create threads, so it waits
/// for the scenario without a `Proc`.
pub fn nsroot(test: &str) -> ! {
    // SAFETY: unshare with CLONE_NEWPID only changes the pid namespace of this thread's
    // future children; no memory is involved.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWPID) };
    assert_eq!(
        rc,
        0,
        "unshare(CLONE_NEWPID): {}",
        std::io::Error::last_os_error()
    );
    let status = RoleCommand::new(test, "scenario")
        .into_command()
        .status()
        .expect("run the scenario");
    std::process::exit(status.code().unwrap_or(101));
}

/// In the scenario (pid 1 of the new namespace): a private mount namespace with a
/// `/proc` of the new pid namespace, so `/proc/<pid>` and `ns_last_pid` mean our pids.
/// Call before anything reads the process identity.
pub fn mount_own_proc() {
    // SAFETY: unshare(CLONE_NEWNS) gives this thread (and its future children) a private
    // copy of the mount table; the mount calls take valid NUL-terminated strings.
    unsafe {
        assert_eq!(libc::unshare(libc::CLONE_NEWNS), 0, "unshare(CLONE_NEWNS)");
        assert_eq!(
            libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ),
            0,
            "make / private: {}",
            std::io::Error::last_os_error()
        );
        assert_eq!(
            libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                0,
                std::ptr::null(),
            ),
            0,
            "mount proc: {}",
            std::io::Error::last_os_error()
        );
    }
    assert_eq!(std::process::id(), 1, "the scenario runs as pid 1");
}

/// Spawns `role` so that it gets pid `pid` in our namespace (the pid must be free and no
/// other process of the namespace may fork meanwhile).
pub fn spawn_with_pid(pid: u32, test: &str, role: &str, args: &[(&str, &str)]) -> Proc {
    std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", pid - 1))
        .expect("write ns_last_pid");
    let child = spawn(test, role, &dir(), args);
    assert_eq!(child.pid(), pid, "the child did not get the wanted pid");
    child
}

/// Waits (bounded) for the child's first report starting with `tag`, skipping others;
/// panics if the child exits first.
pub fn wait_line(child: &mut Proc, tag: &str) -> String {
    loop {
        let line = child.next_report(DEADLINE);
        if line.starts_with(tag) {
            return line;
        }
    }
}

/// Parks a child role until its parent kills it.
pub fn park() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `n` shared 64-bit words in the file `path`, mapped `MAP_SHARED` (the file is created
/// and sized to whole pages as needed; the mapping is never unmapped): a board that every
/// process of a test maps to report to the others, or to a checker, with atomics.
pub fn words(path: &Path, n: usize) -> &'static [AtomicU64] {
    use std::os::fd::AsRawFd;
    let bytes = (n * 8).div_ceil(4096).max(1) * 4096;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap();
    if (f.metadata().unwrap().len() as usize) < bytes {
        f.set_len(bytes as u64).unwrap();
    }
    // SAFETY: a fresh shared read-write mapping of `bytes` bytes of an open file at least
    // that long; the result is checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "mmap");
    // SAFETY: the mapping is `bytes` >= 8 * n bytes long, page aligned, never unmapped,
    // and only accessed through atomics (in every process).
    unsafe { std::slice::from_raw_parts(p as *const AtomicU64, n) }
}
