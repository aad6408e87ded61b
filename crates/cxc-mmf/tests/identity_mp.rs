//! Process identity across real processes: an exited child is dead (also as an unreaped
//! zombie), a child whose main thread called `pthread_exit` while a worker runs is alive,
//! a child made by `fork` without `exec` is a new identity, and the fallback path (no
//! pidfs: pid + start time + boot id) gives the same verdicts. `threads_stopped` (no
//! thread can run user code again) is true only of a process that is gone: never of a
//! live one, a stopped one, or one whose main thread exited while a worker runs.
//!
//! This test has its own `main` (no libtest harness): a child role must end the process's
//! main thread while a worker thread runs. Children are this binary re-executed with
//! `CXC_ROLE` set.
#![allow(unsafe_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cxc_mmf::identity::{
    self, Identity, Liveness, PidWatch, ProcStatus, force_fallback, liveness, proc_status,
    threads_stopped,
};

const ROLE: &str = "CXC_ROLE";

/// One scenario, run with the fallback path off and on.
type Test = fn(bool);

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        match role.as_str() {
            "report" => role_report(),
            "pthread_exit" => role_pthread_exit(),
            "sleep" => std::thread::sleep(Duration::from_millis(100)),
            other => panic!("unknown role {other}"),
        }
        return;
    }
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let tests: [(&str, Test); 6] = [
        ("self_alive", self_alive),
        (
            "exited_child_dead_also_as_zombie",
            exited_child_dead_also_as_zombie,
        ),
        ("main_thread_exit_is_alive", main_thread_exit_is_alive),
        (
            "fork_without_exec_is_new_identity",
            fork_without_exec_is_new_identity,
        ),
        (
            "raw_fork_syscall_is_new_identity",
            raw_fork_syscall_is_new_identity,
        ),
        ("child_reports_its_identity", child_reports_its_identity),
    ];
    let mut ran = 0;
    for fallback in [false, true] {
        force_fallback(fallback);
        for (name, test) in tests {
            let full = format!("{name}{}", if fallback { "_fallback" } else { "" });
            if filter.as_ref().is_some_and(|f| !full.contains(f.as_str())) {
                continue;
            }
            print!("test {full} ... ");
            std::io::stdout().flush().unwrap();
            test(fallback);
            println!("ok");
            ran += 1;
        }
    }
    println!("\ntest result: ok. {ran} passed");
}

/// Re-executes this binary in `role`, stdin and stdout piped.
fn spawn(role: &str, fallback: bool) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.env(ROLE, role)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if fallback {
        cmd.env("CXC_IDENTITY_FALLBACK", "1");
    } else {
        cmd.env_remove("CXC_IDENTITY_FALLBACK");
    }
    cmd.spawn().unwrap()
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn check_form(id: &Identity, fallback: bool) {
    assert!(id.is_known(), "{id:?}");
    assert_eq!(id.is_fallback(), fallback, "{id:?}");
}

fn self_alive(fallback: bool) {
    let me = Identity::current();
    check_form(&me, fallback);
    assert_eq!(identity::fallback_active(), fallback);
    assert_eq!(liveness(&me), Liveness::Alive);
    assert!(!threads_stopped(&me), "this process runs");
    assert_eq!(Identity::of_pid(me.pid), Some(me));
    assert!(!PidWatch::open(&me).unwrap().is_dead());
}

fn exited_child_dead_also_as_zombie(fallback: bool) {
    let mut child = spawn("sleep", fallback);
    let id = Identity::of_pid(child.id()).expect("a running child is identified");
    check_form(&id, fallback);
    assert_eq!(liveness(&id), Liveness::Alive);
    assert!(!threads_stopped(&id), "a running child");
    let watch = PidWatch::open(&id).expect("a running child can be watched");
    assert!(!watch.is_dead());
    // Not reaped: a zombie.
    wait_until("child exits", || proc_status(id.pid) == ProcStatus::Zombie);
    assert_eq!(liveness(&id), Liveness::Dead, "unreaped zombie");
    assert!(threads_stopped(&id), "unreaped zombie");
    assert!(watch.is_dead());
    assert_eq!(identity::proc_group_alive(id.pid), Some(false));
    child.wait().unwrap();
    assert_eq!(liveness(&id), Liveness::Dead, "reaped");
    assert!(threads_stopped(&id), "reaped");
    assert!(watch.is_dead());
    assert!(PidWatch::open(&id).is_none());
}

fn main_thread_exit_is_alive(fallback: bool) {
    let mut child = spawn("pthread_exit", fallback);
    let id = Identity::of_pid(child.id()).unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "READY");
    // The main thread is gone: /proc/<pid>/stat says Z while the worker runs.
    wait_until("main thread exits", || {
        proc_status(id.pid) == ProcStatus::Zombie
    });
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        liveness(&id),
        Liveness::Alive,
        "Z of the main thread is not death"
    );
    assert_eq!(identity::proc_group_alive(id.pid), Some(true));
    assert!(
        !threads_stopped(&id),
        "a worker thread still runs user code"
    );
    // Stopped by a signal: its threads run again when continued.
    let pid = rustix::process::Pid::from_raw(id.pid as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::STOP).unwrap();
    wait_until("child stops", || {
        std::fs::read_dir(format!("/proc/{}/task", id.pid))
            .unwrap()
            .filter_map(Result::ok)
            .all(|t| {
                std::fs::read_to_string(t.path().join("stat")).is_ok_and(|s| {
                    s.rsplit(')')
                        .next()
                        .and_then(|r| r.split_whitespace().next())
                        .is_some_and(|st| st == "T" || st == "Z")
                })
            })
    });
    assert!(!threads_stopped(&id), "SIGSTOP is not an exit");
    rustix::process::kill_process(pid, rustix::process::Signal::CONT).unwrap();
    let watch = PidWatch::open(&id).expect("a live group can be watched");
    assert!(!watch.is_dead());
    // Release the worker: the process exits as a whole.
    drop(child.stdin.take());
    wait_until("worker exits", || watch.is_dead());
    assert_eq!(liveness(&id), Liveness::Dead);
    assert!(threads_stopped(&id), "every thread exited");
    child.wait().unwrap();
    assert_eq!(liveness(&id), Liveness::Dead);
}

fn fork_without_exec_is_new_identity(fallback: bool) {
    forked_child_is_new_identity(fallback, false);
}

/// The same through the raw `fork` system call, which runs none of libc's fork handlers:
/// the cache must not depend on them.
fn raw_fork_syscall_is_new_identity(fallback: bool) {
    forked_child_is_new_identity(fallback, true);
}

fn forked_child_is_new_identity(fallback: bool, raw: bool) {
    let me = Identity::current();
    // Warm: the child must not see the parent's cached identity.
    assert_eq!(cxc_mmf::identity::current_pid(), std::process::id());
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe(2) to fill.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child only computes its identity (allocation-free), writes it with
    // write(2) and leaves with _exit(2); it touches no lock another thread may hold.
    let pid = if raw {
        // SAFETY: as above; the raw system call (a `clone` that behaves as `fork`) only
        // skips libc's fork handlers.
        unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) as libc::pid_t }
    } else {
        // SAFETY: as above.
        unsafe { libc::fork() }
    };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        if cxc_mmf::identity::current_pid() == me.pid {
            // SAFETY: leaving the child at once, with a status the parent checks.
            unsafe { libc::_exit(3) };
        }
        let words = Identity::current().to_words();
        let mut bytes = [0u8; 32];
        for (chunk, w) in bytes.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        // SAFETY: `bytes` is a valid buffer of 32 bytes; fds[1] is the pipe's write end.
        unsafe {
            libc::write(fds[1], bytes.as_ptr().cast(), bytes.len());
            libc::_exit(0);
        }
    }
    // SAFETY: closing our copy of the write end, which we own.
    unsafe { libc::close(fds[1]) };
    let mut bytes = [0u8; 32];
    // SAFETY: fds[0] is the pipe's read end, owned by us from here on.
    let mut r = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    let mut status = 0;
    // SAFETY: waiting for our own child with a valid status pointer (its 32 bytes fit in
    // the pipe's buffer, so it never waits for us).
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(status, 0, "the child saw its parent's pid as current_pid()");
    r.read_exact(&mut bytes).unwrap();
    let mut words = [0u64; 4];
    for (w, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *w = u64::from_ne_bytes(chunk.try_into().unwrap());
    }
    let kid = Identity::from_words(words);
    check_form(&kid, fallback);
    assert_eq!(
        kid.pid, pid as u32,
        "the child must not report its parent's pid"
    );
    assert_ne!(kid, me);
    assert_ne!(kid.unique, me.unique);
    assert_eq!((kid.pidns, kid.boot), (me.pidns, me.boot));
    assert_eq!(liveness(&kid), Liveness::Dead);
    // The parent's cache was not disturbed.
    assert_eq!(Identity::current(), me);
}

fn child_reports_its_identity(fallback: bool) {
    let mut child = spawn("report", fallback);
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let words: Vec<u64> = line
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    let kid = Identity::from_words(words.try_into().unwrap());
    check_form(&kid, fallback);
    assert_eq!(
        Identity::of_pid(kid.pid),
        Some(kid),
        "of_pid agrees with current"
    );
    assert_eq!(liveness(&kid), Liveness::Alive);
    drop(child.stdin.take());
    child.wait().unwrap();
    assert_eq!(liveness(&kid), Liveness::Dead);
}

/// Child: prints `Identity::current()` as four words, then waits for stdin to close.
fn role_report() {
    let w = Identity::current().to_words();
    println!("{} {} {} {}", w[0], w[1], w[2], w[3]);
    std::io::stdout().flush().unwrap();
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
}

/// Child: a worker thread waits for stdin to close, then exits the process; the main
/// thread exits (as by `pthread_exit`) as soon as the worker runs.
fn role_pthread_exit() {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        tx.send(()).unwrap();
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    rx.recv().unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    // `pthread_exit` would unwind through Rust's `main` frames, which glibc aborts ("exception
    // not rethrown"); its last step, the thread-only exit(2) system call, ends the main
    // thread exactly as the kernel sees a `pthread_exit`.
    // SAFETY: ends the calling (main) thread only, without unwinding; the process lives
    // on in the worker, which references nothing on this thread's stack.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
}
