#![cfg(not(cxc_loom))]
//! Attacks the "orphan look" (`cxc_mmf::orphan`, docs/owner-lease.md "The sentinel",
//! docs/leader-election.md "Background renewal and its risk", docs/sidecar.md): a
//! long-lived `cxc-` thread ends a process whose main thread exited and that has no
//! application thread left, with the main thread's status, through `exit(3)`; and it
//! never ends a process that still has an application thread in any state (running, in
//! a hand-off chain, traced and stopped, blocked in `acquire`, in uninterruptible sleep,
//! named like ours but not `cxc-`, started from a library thread) or whose main thread
//! still lives. Also: a main thread whose name is not UTF-8 (an executable whose file
//! name is cut by the kernel's 15-byte `comm` in the middle of a character).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{
    ElectionBackend, ElectionConfig, Elector, Leader, LeaseOptions, OwnerLease, Preemption, Renewal,
};
use cxc_testkit::{
    Proc, RoleCommand, in_role, main_thread_exited, num, path_arg, report, wait_until,
};

/// A grace no test reaches: only the OS or the sentinel can end a claim.
const BIG: u64 = 1 << 40;

/// A lease without preemption (a waiter's pid may be lower or higher than its holder's).
fn lease_at(dir: &tempfile::TempDir, name: &str) -> OwnerLease<u64> {
    let opts = LeaseOptions {
        preemption: Preemption::Never,
        ..LeaseOptions::default()
    };
    OwnerLease::create_with(dir.path().join(name), 0, &opts).unwrap()
}

/// In a child: opens the lease at role argument `path` and claims it (which starts the
/// process's `cxc-sentinel`).
fn hold_lease() -> OwnerLease<u64> {
    let l: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
    assert!(
        l.try_acquire(std::process::id(), BIG),
        "child could not claim"
    );
    l
}

fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The state letter of thread `tid` of process `pid` (`None`: gone or unreadable).
fn thread_state(pid: u32, tid: i32) -> Option<char> {
    let stat = std::fs::read(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
    let stat = String::from_utf8_lossy(&stat);
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// The `stat` lines (name and state) of every thread of process `pid`.
fn threads_of(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read(t.path().join("stat")).ok())
        .map(|s| String::from_utf8_lossy(&s).chars().take(40).collect())
        .collect()
}

/// Sends `sig` to this process's main thread only.
fn signal_main(sig: libc::c_int, handler: extern "C" fn(libc::c_int)) {
    let pid = std::process::id() as libc::pid_t;
    assert_ne!(gettid(), pid, "called on the main thread");
    // SAFETY: installs `handler` (which only makes async-signal-safe calls) and sends the
    // signal to this process's main thread (tid == pid) only.
    unsafe {
        libc::signal(
            sig,
            handler as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::syscall(libc::SYS_tgkill, pid, pid, sig);
    }
}

// ---------------------------------------------------------------------------------------
// 1. A hand-off chain: at every instant one application thread is alive, but each lives
//    only as long as it takes to start the next.

const CHAIN_FOR: Duration = Duration::from_secs(6);

fn link(deadline: Instant, links: Arc<AtomicU64>) {
    let n = links.fetch_add(1, Ordering::Relaxed) + 1;
    if Instant::now() >= deadline {
        report(format!("done links={n}"));
        return;
    }
    if n.is_multiple_of(5000) {
        report(format!("links={n}"));
    }
    std::thread::Builder::new()
        .name("chain".into())
        .spawn(move || link(deadline, links))
        .expect("spawn the next link");
    // Returns at once: the next link runs, this one ends.
}

/// Main exited; the application's only thread spawns a successor and ends, over and over,
/// for 6 s. There is always a live application thread (the successor exists before its
/// predecessor returns), so the process must live until the chain stops, then end.
#[test]
fn a_chain_of_handed_off_threads_keeps_its_process_alive() {
    const T: &str = "a_chain_of_handed_off_threads_keeps_its_process_alive";
    if in_role("chain") {
        let l = hold_lease();
        assert!(cxc_testkit::exit_main_thread());
        report("started");
        link(Instant::now() + CHAIN_FOR, Arc::new(AtomicU64::new(0)));
        std::mem::forget(l);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lease = lease_at(&dir, "l");
    let mut kid = RoleCommand::new(T, "chain")
        .arg("path", dir.path().join("l"))
        .spawn();
    assert_eq!(kid.next_report(Duration::from_secs(10)), "started");
    let t0 = Instant::now();
    let early = kid.wait_timeout(CHAIN_FOR - Duration::from_millis(500));
    assert!(
        early.is_none(),
        "the process was ended {:?} into a 6 s hand-off chain (status {early:?}) \
         although an application thread was alive at every instant; stdout:\n{}",
        t0.elapsed(),
        kid.stdout()
    );
    assert_eq!(lease.current_owner(), Some(kid.pid()));
    let mut last = kid.next_report(Duration::from_secs(10));
    while !last.starts_with("done") {
        last = kid.next_report(Duration::from_secs(10));
    }
    eprintln!("chain: {last}");
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "the process did not end after its chain did: {status:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. A last application thread stopped by its tracer (state `t`): the whole process is
//    not stopped, the library's threads still look.

/// Main exited; the parent PTRACE_SEIZEs and PTRACE_INTERRUPTs the one application
/// thread for 3 s. The process must live and keep its lease; detached, the thread goes
/// on, releases, ends, and then the process ends with status 0.
#[test]
fn a_traced_and_stopped_last_thread_keeps_its_process_and_lease() {
    const T: &str = "a_traced_and_stopped_last_thread_keeps_its_process_and_lease";
    if in_role("traced") {
        let l = hold_lease();
        assert!(cxc_testkit::exit_main_thread());
        report(format!("tid={}", gettid()));
        let go = path_arg("go");
        while !go.exists() {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(l.release(std::process::id()));
        report("released");
        std::mem::forget(l);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lease = lease_at(&dir, "l");
    let go = dir.path().join("go");
    let mut kid = RoleCommand::new(T, "traced")
        .arg("path", dir.path().join("l"))
        .arg("go", &go)
        .spawn();
    let tid = num(&kid.next_report(Duration::from_secs(10)), "tid") as libc::pid_t;
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: ptrace requests on our own child's thread; no memory is passed.
    let seized = unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, null, null) };
    assert_eq!(
        seized,
        0,
        "PTRACE_SEIZE: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: as above.
    let r = unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, null, null) };
    assert_eq!(
        r,
        0,
        "PTRACE_INTERRUPT: {}",
        std::io::Error::last_os_error()
    );
    let mut st = 0;
    // SAFETY: waits for the ptrace stop of the thread we trace; `st` is a valid int.
    let w = unsafe { libc::waitpid(tid, &mut st, libc::__WALL) };
    assert_eq!(w, tid, "waitpid: {}", std::io::Error::last_os_error());
    assert!(libc::WIFSTOPPED(st), "not stopped: {st:#x}");
    assert_eq!(thread_state(kid.pid(), tid), Some('t'));
    let t0 = Instant::now();
    let early = kid.wait_timeout(Duration::from_secs(3));
    assert!(
        early.is_none(),
        "a process whose last application thread was traced-stopped was ended after {:?}: {early:?}",
        t0.elapsed()
    );
    assert_eq!(thread_state(kid.pid(), tid), Some('t'));
    assert_eq!(
        lease.current_owner(),
        Some(kid.pid()),
        "it lost its lease while alive"
    );
    assert!(!lease.try_acquire(std::process::id(), BIG));
    // SAFETY: detaches the stopped tracee, letting it run on.
    let r = unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, null, null) };
    assert_eq!(r, 0, "PTRACE_DETACH: {}", std::io::Error::last_os_error());
    std::fs::write(&go, b"").unwrap();
    assert_eq!(kid.next_report(Duration::from_secs(5)), "released");
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

// ---------------------------------------------------------------------------------------
// 3. A last application thread blocked in `acquire` on a lease another process holds.

/// Main exited; the application's one thread waits in `OwnerLease::acquire` for 3 s on
/// a lease this (parent) process holds. It must not be ended, and must get the lease
/// once released.
#[test]
fn a_last_thread_blocked_in_acquire_keeps_its_process_and_gets_the_lease() {
    const T: &str = "a_last_thread_blocked_in_acquire_keeps_its_process_and_gets_the_lease";
    if in_role("waiter") {
        let l: OwnerLease<u64> = OwnerLease::open(path_arg("path")).unwrap();
        assert!(cxc_testkit::exit_main_thread());
        report("waiting");
        let c = l.acquire(std::process::id(), BIG, Duration::from_secs(20));
        report(format!("got={}", c.is_some()));
        if let Some(c) = c {
            assert!(l.release_claim(&c));
        }
        std::mem::forget(l);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lease = lease_at(&dir, "l");
    let me = std::process::id();
    assert!(lease.try_acquire(me, BIG));
    let mut kid = RoleCommand::new(T, "waiter")
        .arg("path", dir.path().join("l"))
        .spawn();
    assert_eq!(kid.next_report(Duration::from_secs(10)), "waiting");
    let t0 = Instant::now();
    let early = kid.wait_timeout(Duration::from_secs(3));
    assert!(
        early.is_none(),
        "a process whose last thread waited in acquire was ended after {:?}: {early:?}",
        t0.elapsed()
    );
    assert!(lease.release(me));
    assert_eq!(kid.next_report(Duration::from_secs(5)), "got=true");
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    assert!(lease.try_acquire(me, BIG), "the waiter's claim outlived it");
}

// ---------------------------------------------------------------------------------------
// 4. The exit: the main thread's own status (not just 0), `atexit` handlers, stdio.

static ATEXIT_PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

extern "C" fn write_atexit_marker() {
    if let Some(p) = ATEXIT_PATH.get() {
        let _ = std::fs::write(p, b"atexit ran");
    }
}

extern "C" fn exit_this_thread_with_3(_: libc::c_int) {
    // SAFETY: the thread-only exit(2) system call is async-signal-safe; it ends the
    // thread (the main thread) with status 3, without unwinding.
    unsafe { libc::syscall(libc::SYS_exit, 3) };
}

/// Main exits (thread only) with status 3; the last application thread ends. As the
/// kernel would for a process whose last thread ends, the process must exit with 3, and
/// (through `exit(3)`) its `atexit` handlers run and a partial stdout line is flushed.
#[test]
fn the_process_ends_with_the_main_threads_status_and_runs_atexit() {
    const T: &str = "the_process_ends_with_the_main_threads_status_and_runs_atexit";
    if in_role("status") {
        let l = hold_lease();
        ATEXIT_PATH.set(path_arg("marker")).unwrap();
        // SAFETY: registers a handler that only writes a file.
        assert_eq!(unsafe { libc::atexit(write_atexit_marker) }, 0);
        signal_main(libc::SIGUSR1, exit_this_thread_with_3);
        assert!(wait_until(Duration::from_secs(5), main_thread_exited));
        report("ready");
        // No newline: held in std's line buffer until something flushes it.
        print!("unflushed-tail");
        std::mem::forget(l);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _lease = lease_at(&dir, "l");
    let marker = dir.path().join("marker");
    let mut kid = RoleCommand::new(T, "status")
        .arg("path", dir.path().join("l"))
        .arg("marker", &marker)
        .spawn();
    assert_eq!(kid.next_report(Duration::from_secs(10)), "ready");
    let status = kid.wait_timeout(Duration::from_secs(5));
    let Some(status) = status else {
        panic!("the process did not end when its last own thread did");
    };
    assert_eq!(
        (status.code(), status.signal()),
        (Some(3), None),
        "not the main thread's exit status"
    );
    assert_eq!(
        std::fs::read(&marker).ok().as_deref(),
        Some(&b"atexit ran"[..]),
        "atexit handlers did not run"
    );
    assert!(
        wait_until(Duration::from_secs(3), || kid
            .stdout()
            .contains("unflushed-tail")),
        "buffered stdout was lost: {:?}",
        kid.stdout()
    );
}

// ---------------------------------------------------------------------------------------
// 5. Names that look like ours but are not `cxc-`.

const LOOKALIKES: [&str; 5] = ["cxcworker", "cxc_pool", "CXC-io", "cxc", " cxc-lead"];

fn lookalike(i: usize) {
    report(format!("alive i={i}"));
    std::thread::sleep(Duration::from_millis(1000));
    if let Some(next) = LOOKALIKES.get(i + 1) {
        std::thread::Builder::new()
            .name((*next).into())
            .spawn(move || lookalike(i + 1))
            .unwrap();
    } else {
        report("last");
    }
}

/// Main exited; the application's threads, one at a time for 1 s each, are named
/// `cxcworker`, `cxc_pool`, `CXC-io`, `cxc`, ` cxc-lead`: none begins with `cxc-`, each
/// alone must keep the process alive.
#[test]
fn threads_named_like_ours_but_not_cxc_dash_keep_the_process_alive() {
    const T: &str = "threads_named_like_ours_but_not_cxc_dash_keep_the_process_alive";
    if in_role("lookalikes") {
        let l = hold_lease();
        assert!(cxc_testkit::exit_main_thread());
        std::thread::Builder::new()
            .name(LOOKALIKES[0].into())
            .spawn(|| lookalike(0))
            .unwrap();
        std::mem::forget(l);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let _lease = lease_at(&dir, "l");
    let mut kid = RoleCommand::new(T, "lookalikes")
        .arg("path", dir.path().join("l"))
        .spawn();
    for (i, name) in LOOKALIKES.iter().enumerate() {
        assert_eq!(
            kid.next_report(Duration::from_secs(10)),
            format!("alive i={i}")
        );
        // Its name really is the lookalike (the kernel's `comm`).
        let pid = kid.pid();
        let named = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .any(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.trim_end_matches('\n') == *name)
            });
        assert!(named, "no thread named {name:?}");
    }
    let last = kid.next_report(Duration::from_secs(10));
    assert_eq!(last, "last");
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

// ---------------------------------------------------------------------------------------
// 6. A main thread that lives (asleep for ever) while all other application threads end.

static MAIN_ASLEEP: AtomicBool = AtomicBool::new(false);

extern "C" fn sleep_for_ever(_: libc::c_int) {
    MAIN_ASLEEP.store(true, Ordering::SeqCst);
    loop {
        // SAFETY: pause(2) is async-signal-safe and has no preconditions.
        unsafe { libc::pause() };
    }
}

/// The main thread is alive, asleep for ever (in a signal handler); the test thread, the
/// only other application thread, ends holding the lease. The process has only its main
/// thread and the sentinel: it must never be ended, nor lose its lease.
#[test]
fn a_process_whose_main_thread_sleeps_for_ever_is_never_ended() {
    const T: &str = "a_process_whose_main_thread_sleeps_for_ever_is_never_ended";
    if in_role("main_sleeps") {
        let l = hold_lease();
        signal_main(libc::SIGUSR1, sleep_for_ever);
        assert!(wait_until(Duration::from_secs(5), || MAIN_ASLEEP
            .load(Ordering::SeqCst)));
        report("main asleep");
        std::mem::forget(l);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lease = lease_at(&dir, "l");
    let mut kid = RoleCommand::new(T, "main_sleeps")
        .arg("path", dir.path().join("l"))
        .spawn();
    assert_eq!(kid.next_report(Duration::from_secs(10)), "main asleep");
    let pid = kid.pid();
    // Wait until only the main thread and the sentinel are left.
    let only_two = wait_until(Duration::from_secs(5), || {
        std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| d.count() == 2)
    });
    assert!(only_two, "the test thread did not end");
    let early = kid.wait_timeout(Duration::from_millis(3500));
    assert!(
        early.is_none(),
        "a process whose main thread lives was ended: {early:?}"
    );
    assert_eq!(thread_state(pid, pid as i32), Some('S'));
    assert_eq!(lease.current_owner(), Some(pid));
    kid.kill();
}

// ---------------------------------------------------------------------------------------
// 7. A last application thread in uninterruptible sleep (`D`: waiting for a vfork child).

extern "C" fn vfork_child(_: *mut libc::c_void) -> libc::c_int {
    let ts = libc::timespec {
        tv_sec: 3,
        tv_nsec: 0,
    };
    // SAFETY: a raw nanosleep with a valid timespec; the vfork child touches nothing else
    // of the memory it shares with its parent.
    unsafe {
        libc::syscall(
            libc::SYS_nanosleep,
            &ts,
            std::ptr::null_mut::<libc::timespec>(),
        )
    };
    0
}

/// Main exited; the one application thread waits for a `CLONE_VFORK` child that sleeps
/// 3 s, in uninterruptible sleep (`D`). It must not be ended; afterwards it ends and then
/// the process does.
#[test]
fn a_last_thread_in_uninterruptible_sleep_keeps_its_process_alive() {
    const T: &str = "a_last_thread_in_uninterruptible_sleep_keeps_its_process_alive";
    if in_role("vforker") {
        let l = hold_lease();
        assert!(cxc_testkit::exit_main_thread());
        report(format!("tid={}", gettid()));
        let mut stack = vec![0u128; 4096];
        let top = stack.as_mut_ptr_range().end.cast::<libc::c_void>();
        // SAFETY: the child runs `vfork_child` on its own 64 KiB stack (16-byte aligned
        // top) and exits when it returns; this thread is suspended until then (vfork).
        let child = unsafe {
            libc::clone(
                vfork_child,
                top,
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                std::ptr::null_mut(),
            )
        };
        assert!(child > 0, "clone: {}", std::io::Error::last_os_error());
        let mut st = 0;
        // SAFETY: reaps our own child; `st` is a valid int.
        unsafe { libc::waitpid(child, &mut st, 0) };
        drop(stack);
        report("vfork done");
        std::mem::forget(l);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let lease = lease_at(&dir, "l");
    let mut kid = RoleCommand::new(T, "vforker")
        .arg("path", dir.path().join("l"))
        .spawn();
    let tid = num(&kid.next_report(Duration::from_secs(10)), "tid") as i32;
    let pid = kid.pid();
    assert!(
        wait_until(Duration::from_secs(2), || thread_state(pid, tid)
            == Some('D')),
        "the thread never was in D: {:?}",
        thread_state(pid, tid)
    );
    let t0 = Instant::now();
    let early = kid.wait_timeout(Duration::from_millis(2300));
    assert!(
        early.is_none(),
        "a process whose last thread was in D was ended after {:?}: {early:?}",
        t0.elapsed()
    );
    assert_eq!(lease.current_owner(), Some(pid));
    assert_eq!(kid.next_report(Duration::from_secs(5)), "vfork done");
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

// ---------------------------------------------------------------------------------------
// 8. A main thread whose `comm` is not UTF-8: the executable's file name, cut at 15
//    bytes by the kernel in the middle of a character.

extern "C" fn exit_this_thread_with_0(_: libc::c_int) {
    // SAFETY: the thread-only exit(2) system call is async-signal-safe; it ends the
    // thread (the main thread) with status 0, without unwinding.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
}

/// Whether the main thread has exited, read from `/proc/self/stat` as bytes.
fn main_exited_bytes() -> bool {
    std::fs::read("/proc/self/stat").is_ok_and(|s| {
        let close = s.iter().rposition(|&b| b == b')').unwrap_or(0);
        s[close + 1..]
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'Z' || b == b'X')
    })
}

/// The child's executable file name: `prüfung-aufträge`, whose first 15 bytes end with
/// the first byte of `ä`.
const NON_ASCII_EXE: &str = "prüfung-aufträge";

/// The test binary is run through a symlink named [`NON_ASCII_EXE`]; its main thread's
/// `comm` is then `prüfung-auftr\xc3`, not UTF-8. It claims the lease, ends its main
/// thread, and its last own thread ends: the process must end (status 0) as any other,
/// and its claim with it, not be kept alive for ever by its sentinel.
#[test]
fn a_process_whose_main_threads_name_is_not_utf8_is_not_kept_alive() {
    const T: &str = "a_process_whose_main_threads_name_is_not_utf8_is_not_kept_alive";
    if in_role("holder") {
        let l = hold_lease();
        // Not `cxc_testkit::exit_main_thread`: its check reads `/proc/self/stat` as UTF-8.
        signal_main(libc::SIGUSR1, exit_this_thread_with_0);
        assert!(wait_until(Duration::from_secs(5), main_exited_bytes));
        report("held");
        std::mem::forget(l);
        return;
    }
    assert!(std::str::from_utf8(&NON_ASCII_EXE.as_bytes()[..15]).is_err());
    let dir = tempfile::tempdir().unwrap();
    let lease = lease_at(&dir, "l");
    let link: PathBuf = dir.path().join(NON_ASCII_EXE);
    std::os::unix::fs::symlink(std::env::current_exe().unwrap(), &link).unwrap();
    let mut cmd = std::process::Command::new(&link);
    cmd.args([
        "--exact",
        T,
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(cxc_testkit::ROLE_VAR, "holder")
    .env(
        format!("{}PATH", cxc_testkit::ARG_VAR_PREFIX),
        dir.path().join("l"),
    );
    let mut kid = Proc::spawn(cmd, "holder run as prüfung-aufträge");
    assert_eq!(kid.next_report(Duration::from_secs(10)), "held");
    let comm = std::fs::read(format!("/proc/{}/comm", kid.pid())).unwrap();
    assert!(
        std::str::from_utf8(&comm).is_err(),
        "precondition: comm {comm:?} is UTF-8"
    );
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(
        status.is_some_and(|s| s.success()),
        "the process (main thread comm {:?}) was not ended 5 s after its last own thread \
         ended: {status:?}; its threads: {:?}",
        String::from_utf8_lossy(&comm),
        threads_of(kid.pid())
    );
    assert!(
        lease
            .acquire(std::process::id(), BIG, Duration::from_secs(2))
            .is_some(),
        "its claim outlived it"
    );
}

// ---------------------------------------------------------------------------------------
// 9. An application thread started from a library thread: it inherits the `cxc-` name.

static WORKER_STARTED: AtomicBool = AtomicBool::new(false);

/// A backend that, at its first renewal (on the renewer thread), starts an (unnamed)
/// worker thread of the application that works for 3 s.
struct SpawningBackend(PathBuf);

fn worker(path: &Path) {
    let comm = std::fs::read_to_string("/proc/thread-self/comm").unwrap_or_default();
    report(format!("worker comm={}", comm.trim_end().replace(' ', "_")));
    WORKER_STARTED.store(true, Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(3);
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        std::fs::write(path, n.to_string()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
    }
    report("worker done");
}

impl ElectionBackend for SpawningBackend {
    type Term = u64;
    type Error = std::io::Error;
    fn try_lead(&self, _: &str) -> Result<Option<u64>, Self::Error> {
        Ok(Some(1))
    }
    fn lead_timeout(&self, _: &str, _: Duration) -> Result<Option<u64>, Self::Error> {
        Ok(Some(1))
    }
    fn renew(&self, _: &u64) -> Result<bool, Self::Error> {
        static SPAWNED: AtomicBool = AtomicBool::new(false);
        if !SPAWNED.swap(true, Ordering::SeqCst) {
            let path = self.0.clone();
            std::thread::spawn(move || worker(&path));
        }
        Ok(true)
    }
    fn is_current(&self, _: &u64) -> Result<bool, Self::Error> {
        Ok(true)
    }
    fn resign(&self, _: &u64) -> Result<bool, Self::Error> {
        Ok(true)
    }
    fn leader(&self) -> Result<Option<Leader>, Self::Error> {
        Ok(None)
    }
    fn wait_lost(&self, _: &u64, timeout: Duration) -> Result<bool, Self::Error> {
        std::thread::sleep(timeout);
        Ok(false)
    }
    fn token(term: &u64) -> u64 {
        *term
    }
}

/// A background-renewing leader whose backend starts a worker thread of the
/// application from its first renewal (so on the renewer thread, `cxc-election`). Main
/// exited and the test thread ended: the worker, still working for 3 s, is a live
/// application thread and must keep the process alive.
#[test]
fn an_application_thread_started_from_a_library_thread_keeps_the_process_alive() {
    const T: &str = "an_application_thread_started_from_a_library_thread_keeps_the_process_alive";
    if in_role("bg_leader") {
        let cfg = ElectionConfig::new("bg")
            .lease_duration(Duration::from_millis(300))
            .renewal(Renewal::Background);
        let el = Elector::new(SpawningBackend(path_arg("path")), cfg).expect("elector");
        let l = el.campaign(Duration::from_secs(10)).unwrap().unwrap();
        assert!(wait_until(Duration::from_secs(5), || WORKER_STARTED
            .load(Ordering::SeqCst)));
        assert!(cxc_testkit::exit_main_thread());
        report("leading");
        std::mem::forget((el, l));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let mut kid = RoleCommand::new(T, "bg_leader").arg("path", &work).spawn();
    let comm = kid.next_report(Duration::from_secs(10));
    assert!(comm.starts_with("worker comm="), "{comm}");
    assert_eq!(kid.next_report(Duration::from_secs(10)), "leading");
    let t0 = Instant::now();
    let early = kid.wait_timeout(Duration::from_millis(2000));
    assert!(
        early.is_none(),
        "the process was ended {:?} after its main thread exited while its worker thread \
         ({comm}) still worked: {early:?}; work done: {:?}",
        t0.elapsed(),
        std::fs::read_to_string(&work).ok()
    );
    assert_eq!(kid.next_report(Duration::from_secs(5)), "worker done");
    let status = kid.wait_timeout(Duration::from_secs(5));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}
