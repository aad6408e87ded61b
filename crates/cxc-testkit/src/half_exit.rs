//! Ending a process's main thread alone: the `pthread_exit(3)` pattern, where the process
//! lives on in its other threads while `/proc/PID/stat` shows the main thread `Z`.
#![allow(unsafe_code)]

use std::time::Duration;

/// The signal [`exit_main_thread`] sends to the main thread.
pub const HALF_EXIT_SIGNAL: i32 = libc::SIGUSR2;

extern "C" fn exit_this_thread(_: libc::c_int) {
    // SAFETY: the thread-only exit(2) system call is async-signal-safe; it ends the
    // thread the signal was delivered to (the main thread) without unwinding, and touches
    // no memory of the process.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
}

/// Ends this process's main thread only (status 0), as `pthread_exit(3)` would, and waits
/// up to 5 s until the kernel shows it exited (`Z` in `/proc/self/stat`). Returns whether
/// it did. Call it from another thread (a test body: libtest runs it on a thread of its
/// own); the process then lives on in its other threads and ends when the last one does.
///
/// `pthread_exit` itself would unwind through the Rust frames of `main`, which glibc
/// aborts; the thread-only `exit(2)` system call, its last step, is what the kernel sees
/// of it. It is made from a handler of [`HALF_EXIT_SIGNAL`], installed here and sent to
/// the main thread with `tgkill`.
///
/// # Panics
/// If called on the main thread (it would end the caller).
pub fn exit_main_thread() -> bool {
    let pid = std::process::id() as libc::pid_t;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    assert_ne!(
        tid, pid,
        "exit_main_thread must be called from another thread"
    );
    // SAFETY: installs a handler that only makes the exit(2) system call (above), then
    // sends the signal to this process's main thread (tid == pid) only.
    unsafe {
        libc::signal(
            HALF_EXIT_SIGNAL,
            exit_this_thread as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::syscall(libc::SYS_tgkill, pid, pid, HALF_EXIT_SIGNAL);
    }
    crate::wait_until(Duration::from_secs(5), main_thread_exited)
}

/// Whether this process's main thread has exited (`Z` or `X` in `/proc/self/stat`).
pub fn main_thread_exited() -> bool {
    std::fs::read_to_string("/proc/self/stat").is_ok_and(|s| {
        s.rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|c| c == 'Z' || c == 'X')
    })
}
