//! Process harness for the pid-reuse tests: re-executes this test binary in a role, runs
//! a scenario as pid 1 of a fresh pid namespace (with its own `/proc`), and forks a child
//! with a chosen pid (`/proc/sys/kernel/ns_last_pid`), so a dead process's pid can be
//! handed to a new process on purpose.
//!
//! Roles are passed in `CXC_PROC_ROLE`; the test function named by `--exact` dispatches on
//! it. Children report on files in `CXC_PROC_DIR` (not stdout: the harness may capture it).
#![allow(dead_code, unreachable_pub, unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const ROLE: &str = "CXC_PROC_ROLE";
pub const DIR: &str = "CXC_PROC_DIR";

/// The role of this process, if it is a re-executed child.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// The shared directory of a scenario.
pub fn dir() -> PathBuf {
    PathBuf::from(std::env::var_os(DIR).expect("set by the parent"))
}

/// Whether this process may make pid namespaces and write `ns_last_pid`.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

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

/// Re-executes this binary running only `test`, in `role`, with `env` added.
pub fn spawn(test: &str, role: &str, dir: &Path, env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("RUST_TEST_NOCAPTURE", "1")
        .env(ROLE, role)
        .env(DIR, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory: a
    // child (which parks until killed) dies with the thread that spawned it, so a failed
    // test leaves no process behind.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn().unwrap()
}

/// Runs `test` in role `scenario` as pid 1 of a new pid namespace (through a helper in
/// role `nsroot` that unshares the namespace for its children). Returns its exit status.
pub fn run_in_new_pidns(test: &str, dir: &Path, env: &[(&str, &str)]) -> ExitStatus {
    spawn(test, "nsroot", dir, env).wait().unwrap()
}

/// Role `nsroot`: makes a new pid namespace for its children, runs `scenario` in it,
/// exits with its status.
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
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("CXC_") && k != ROLE && k != DIR)
        .collect();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let status = spawn(test, "scenario", &dir(), &env).wait().unwrap();
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
pub fn spawn_with_pid(pid: u32, test: &str, role: &str, env: &[(&str, &str)]) -> Child {
    std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", pid - 1))
        .expect("write ns_last_pid");
    let child = spawn(test, role, &dir(), env);
    assert_eq!(child.id(), pid, "the child did not get the wanted pid");
    child
}

/// Child side: appends `line` to the report file `name`.
pub fn report(name: &str, line: &str) {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir().join(name))
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

/// Waits (bounded) for a line starting with `tag` in report `name`; panics if `child`
/// exits first.
pub fn wait_line(name: &str, tag: &str, child: &mut Child) -> String {
    let t0 = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(dir().join(name)) {
            if let Some(l) = text.lines().find(|l| l.starts_with(tag)) {
                return l.to_string();
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("child exited ({status}) before reporting {tag}");
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "child never reported {tag}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Kills (SIGKILL) and reaps `child`.
pub fn kill(child: &mut Child) {
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Parks a child role until its parent kills it.
pub fn park() -> ! {
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}
