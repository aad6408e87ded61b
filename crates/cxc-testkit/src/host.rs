//! What a test finds on the machine: programs it runs, and the state of processes it
//! started (from `/proc`).

use std::path::PathBuf;

/// The program `name` a test runs (e.g. a server it starts): the path in environment
/// variable `var` if that is set, else the first `name` on `PATH` that is a file, else
/// `/usr/bin/<name>` if that is a file; `None` if none is.
///
/// ```
/// let sh = cxc_testkit::find_program("CXC_TESTKIT_NO_SUCH_VAR", "sh");
/// assert!(sh.is_some_and(|p| p.is_file()));
/// assert_eq!(cxc_testkit::find_program("CXC_TESTKIT_NO_SUCH_VAR", "no-such-program-here"), None);
/// ```
pub fn find_program(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    on_path
        .or_else(|| Some(PathBuf::from("/usr/bin").join(name)))
        .filter(|p| p.is_file())
}

/// Whether every thread of process `pid` is in `state` (the state letter of
/// `/proc/<pid>/task/*/stat`, e.g. `T` stopped). `false` if the process is gone.
///
/// A SIGSTOP only starts the group stop: until this holds for `T`, a thread that was
/// running may still do work (e.g. a server may still answer a request).
///
/// ```
/// // This process runs: it is not stopped. A process that does not exist is in no state.
/// assert!(!cxc_testkit::all_threads_in_state(std::process::id(), 'T'));
/// assert!(!cxc_testkit::all_threads_in_state(u32::MAX, 'S'));
/// ```
pub fn all_threads_in_state(pid: u32, state: char) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            return false;
        };
        // The state follows the parenthesised command name.
        let found = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if found != Some(state) {
            return false;
        }
        any = true;
    }
    any
}

/// Nanoseconds of `CLOCK_MONOTONIC`: one clock for every process on the machine, so
/// instants recorded by different processes can be compared.
///
/// ```
/// let a = cxc_testkit::mono_ns();
/// assert!(cxc_testkit::mono_ns() >= a);
/// ```
pub fn mono_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    (t.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(t.tv_nsec as u64)
}

/// CPU time (user + system) of the calling process so far, all threads
/// (`CLOCK_PROCESS_CPUTIME_ID`, to the nanosecond).
///
/// ```
/// let a = cxc_testkit::process_cpu();
/// assert!(cxc_testkit::process_cpu() >= a);
/// ```
pub fn process_cpu() -> std::time::Duration {
    cpu_clock(rustix::time::ClockId::ProcessCPUTime)
}

/// CPU time (user + system) of the calling thread so far (`CLOCK_THREAD_CPUTIME_ID`).
///
/// ```
/// let a = cxc_testkit::thread_cpu();
/// assert!(cxc_testkit::thread_cpu() >= a);
/// ```
pub fn thread_cpu() -> std::time::Duration {
    cpu_clock(rustix::time::ClockId::ThreadCPUTime)
}

fn cpu_clock(id: rustix::time::ClockId) -> std::time::Duration {
    let t = rustix::time::clock_gettime(id);
    std::time::Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The native-endian `u64` at byte `offset` of the file at `path`, read with `pread`
/// (not through a mapping): what another process sees of a shared word.
///
/// # Panics
///
/// If the file cannot be opened or is shorter than `offset + 8` bytes.
pub fn read_word(path: &std::path::Path, offset: u64) -> u64 {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, offset)
        .unwrap_or_else(|e| panic!("read {} at {offset}: {e}", path.display()));
    u64::from_ne_bytes(b)
}

/// Sends SIGKILL to process `pid` (which the caller started and has not reaped); an
/// error (already reaped) is ignored. Prefer [`crate::Proc::kill`] when the test has
/// the child's handle.
pub fn sigkill(pid: u32) {
    if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}
