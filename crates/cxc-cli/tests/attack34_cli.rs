//! Thirty-fourth round of attacks on `cxc lease run`, `cxc sem run`, `cxc rwlock run` and
//! `cxc elect` (docs/cli.md): the command started in a hostile environment.
//!
//! What BROKE (the tests were marked `#[ignore = "BREAK: ..."]`; all four are fixed now, see
//! "Fixed:" under each, and docs/cli.md, "Signals the caller set" and "Output that cannot
//! be written"):
//!
//! 1. stderr a pipe whose reader is gone (`cxc ... 2>&1 | head -1`, a dead logger) or
//!    `/dev/full`: every message the keeper prints with `eprintln!` panics on EPIPE
//!    (the runtime ignores SIGPIPE, so the write fails instead of killing the process).
//!    - SIGTERM to a *waiting* run: the keeper's monitor thread panics printing
//!      "interrupted while waiting", so the process does not exit; the wait goes on, and
//!      once the holder is done the run that was cancelled runs its command in full and
//!      exits 0 (lease, sem and rwlock runs alike). Docs: "a monitor thread ends it
//!      meanwhile if its wrapper dies (exit 2) or a signal arrives (exit 128 + the
//!      signal)", exit-code table: "128+S ... if signal S came while the run waited for
//!      its claim ... (nothing was run then)".
//!    - The wrapper SIGKILLed while its run waits: the monitor thread panics printing
//!      "the wrapper is gone"; the keeper lives on, takes the lease when it frees (a
//!      claim is spent: the next run gets token 3, not 2) and starts the command, which it
//!      then terminates.
//!    - `-n` finding the claim taken (and any other error): `main` panics printing the
//!      message and the run exits 101, not 1 or the `-E` code (`flock -n -E 0` exits 0
//!      there: it prints nothing).
//!    - `cxc elect`: once its command ends on its own the keeper panics printing "the
//!      command exited ...; campaigning again": the candidate exits 101 and never
//!      campaigns again. Docs: "Command ends on its own (any code): the keeper gives the
//!      term back at once and campaigns again after `--restart-delay`".
//!    - `cxc create` with stdout a broken pipe makes the file, then exits 101 (minor).
//!    - Not broken: Ctrl-C on `cxc lease run L -- job 2>&1 | cat` while it waits (the
//!      reader dies of the same SIGINT): the keeper's message still found the pipe open
//!      in 3 of 3 manual tries, so the run exited 130; the break needs a reader that died
//!      earlier (`| head -1` after a line, a dead logger).
//!
//!    Fixed: every message goes through `cxc_cli::say!`, which writes to locked stderr and
//!    drops a failed write (the monitor's `process::exit` no longer depends on it); stdout
//!    reports: `create` exits 0 whatever, `inspect`/`watch` exit 0 quietly on EPIPE and 2
//!    on other write errors.
//! 2. SIGHUP or SIGINT ignored by the parent (`nohup cxc lease run ...`, or `cxc ... &` in
//!    a non-interactive shell, where the background job ignores SIGINT): cxc installs its
//!    forwarding handler over the inherited `SIG_IGN`, so the signal that the caller
//!    arranged to be ignored ends the command (exit 129/130); under flock(1) the same
//!    line leaves the command running (the flock control in the test proves it here).
//!    Fixed: a signal inherited as `SIG_IGN` (read with sigaction(2)) gets no handler: it
//!    stays ignored, is not forwarded, and the command inherits it ignored.
//! 3. `-c CMDLINE` with a `PATH` that has no `sh` (a service's trimmed PATH): cxc runs
//!    `sh` looked up in PATH and exits 127; flock(1) `-c` runs `$SHELL` or `/bin/sh` and
//!    works. Fixed: `-c` runs `$SHELL -c`, or `/bin/sh -c` if SHELL is unset or empty.
//! 4. `RLIMIT_FSIZE` 0 (`ulimit -f 0`, sandboxed jobs) and the file missing: making it
//!    raises SIGXFSZ, which kills the keeper: the run exits 153, which the exit-code
//!    table reads as "the command died of signal 25" though nothing ran, with no message,
//!    and leaves `.NAME.cxc-tmp.PID.0` behind; flock(1) makes its (empty) file and runs.
//!    Files that already exist work under the limit. Fixed: cxc catches SIGXFSZ (a no-op
//!    handler, unless the caller ignored it), so the create fails with EFBIG (exit 2, a
//!    message, the temporary file removed); a caught signal reverts to the default at
//!    exec, so the command sees SIGXFSZ as the caller left it.
//!
//! What held:
//!
//! - The controls of 1 (stderr `/dev/null`): a waiting run that gets SIGTERM exits 143
//!   and runs nothing; a killed wrapper's waiting keeper exits at once.
//! - fds 0, 1 and 2 closed when `cxc` starts (the runtime reopens them on `/dev/null`):
//!   the job's descriptors name no lease/sem/rwlock file, no output lands in the file,
//!   `inspect` with closed stdio leaves the file's bytes unchanged, a second run works.
//! - `RLIMIT_NOFILE` from 4 to 16, alone and behind a holder: either exit 2 with nothing
//!   run or a normal run; never an overlap (judged by the kernel's `flock -n` on a side
//!   file inside the job), never a lease left held.
//! - A cgroup-v1 `pids.max` of 1 to 6 around the run (root only): exit 2 (keeper or
//!   thread not started) or a run whose own forks fail; no overlap, the lease vacant
//!   after.
//! - SIGTERM and SIGHUP blocked and SIGCHLD ignored in the parent: the job inherits the
//!   blocked mask (as under flock(1)); a SIGKILLed wrapper's job group is still ended (by
//!   the SIGKILL 2 s after the pending SIGTERM) and the lease freed.
//! - umask 0777 (the file gets 0600 and works), a FIFO, directory, `/dev/null` or
//!   dangling symlink as the path (exit 2 at once, nothing run), a deleted working
//!   directory (a relative path: exit 2, nothing run).
//!
//! Markers are files written with `>>` (`O_APPEND`); "still running" is judged from
//! `/proc`; overlap by `flock -n` on a side file taken inside the job.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cxc_testkit::wait_until;

mod common;
use common::{alive, p};

const CXC: &str = env!("CARGO_BIN_EXE_cxc");

fn cxc(args: &[&str]) -> Command {
    let mut c = Command::new(CXC);
    c.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// A write end of a pipe whose read end is already closed: writes fail with EPIPE.
fn broken_pipe() -> Stdio {
    let (r, w) = std::io::pipe().unwrap();
    drop(r);
    Stdio::from(w)
}

/// A child killed with SIGKILL if the test ends first.
struct Kid(Child);

impl Kid {
    fn spawn(c: &mut Command) -> Kid {
        Kid(c.spawn().expect("spawn"))
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe {
            libc::kill(self.pid() as i32, sig);
        }
    }
    /// Exit code (128 + S for a signal), within `t`.
    fn wait(&mut self, t: Duration) -> Option<i32> {
        let end = Instant::now() + t;
        loop {
            if let Some(s) = self.0.try_wait().unwrap() {
                use std::os::unix::process::ExitStatusExt;
                return Some(s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0)));
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    /// The first child of this process (a wrapper's keeper).
    fn first_child(&self) -> Option<u32> {
        let pid = self.pid();
        let mut got = None;
        wait_until(Duration::from_secs(5), || {
            got = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default()
                .split_whitespace()
                .next()
                .and_then(|s| s.parse().ok());
            got.is_some()
        });
        got
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn have_flock() -> bool {
    Command::new("flock")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The run command for `kind` on `file`, up to the `--`.
fn run_args(kind: &str, file: &Path) -> Vec<String> {
    let f = p(file).to_string();
    match kind {
        "lease" => vec!["lease".into(), "run".into(), f],
        "sem" => vec!["sem".into(), "run".into(), f, "-j".into(), "1".into()],
        "rwlock" => vec!["rwlock".into(), "run".into(), "--exclusive".into(), f],
        _ => unreachable!(),
    }
}

/// `cxc <kind> run FILE [extra...] -- sh -c SCRIPT`.
fn run_cmd(kind: &str, file: &Path, extra: &[&str], script: &str) -> Command {
    let mut args = run_args(kind, file);
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(["--".into(), "sh".into(), "-c".into(), script.to_string()]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    cxc(&a)
}

/// Starts a holder of `file` (its command runs `hold` long) and waits until its command
/// runs.
fn holder(kind: &str, dir: &Path, file: &Path, hold: &str) -> Kid {
    let flag = dir.join(format!(
        "held-{}",
        file.file_name().unwrap().to_string_lossy()
    ));
    let _ = std::fs::remove_file(&flag);
    let script = format!("echo held >> '{}'; sleep {hold}", p(&flag));
    let k = Kid::spawn(&mut run_cmd(kind, file, &[], &script));
    assert!(
        wait_until(Duration::from_secs(5), || flag.exists()),
        "the holder's command did not start"
    );
    k
}

// ---------------------------------------------------------------------------------------
// 1. stderr a broken pipe.

/// A run of `kind` waits behind a holder with stderr `stderr`; SIGTERM reaches its wrapper.
/// Returns what went wrong.
fn sigterm_while_waiting(kind: &str, stderr: fn() -> Stdio) -> Vec<String> {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join(format!("f.{kind}"));
    let ledger = d.path().join("ledger");
    let mut h = holder(kind, d.path(), &file, "1.5");
    let script = format!("echo ran >> '{}'", p(&ledger));
    let mut w = Kid::spawn(run_cmd(kind, &file, &[], &script).stderr(stderr()));
    let keeper = w.first_child();
    std::thread::sleep(Duration::from_millis(300));
    w.signal(libc::SIGTERM);
    let mut bad = Vec::new();
    let code = w.wait(Duration::from_millis(1000));
    if code != Some(143) {
        bad.push(format!(
            "{kind}: waiting run got SIGTERM: exit {code:?} within 1 s (want 143); keeper \
             {keeper:?} alive: {}",
            keeper.is_some_and(alive)
        ));
    }
    assert_eq!(h.wait(Duration::from_secs(5)), Some(0));
    let code = w.wait(Duration::from_secs(3));
    std::thread::sleep(Duration::from_millis(300));
    if read(&ledger).contains("ran") {
        bad.push(format!(
            "{kind}: the run cancelled with SIGTERM while waiting ran its command after the \
             holder ended (exit {code:?})"
        ));
    }
    bad
}

#[test]
fn control_sigterm_while_waiting_runs_nothing() {
    let mut bad = Vec::new();
    for kind in ["lease", "sem", "rwlock"] {
        bad.extend(sigterm_while_waiting(kind, Stdio::null));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn sigterm_while_waiting_with_stderr_a_broken_pipe_runs_nothing() {
    let mut bad = Vec::new();
    for kind in ["lease", "sem", "rwlock"] {
        bad.extend(sigterm_while_waiting(kind, broken_pipe));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The wrapper of a run waiting behind a holder is SIGKILLed: its keeper must exit at
/// once and claim nothing. Returns what went wrong.
fn wrapper_killed_while_waiting(stderr: fn() -> Stdio) -> Vec<String> {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("f.lease");
    let ledger = d.path().join("ledger");
    let tok = d.path().join("tok");
    let mut h = holder("lease", d.path(), &file, "2.5");
    let script = format!("echo ran >> '{}'; sleep 5", p(&ledger));
    let mut w = Kid::spawn(run_cmd("lease", &file, &[], &script).stderr(stderr()));
    let keeper = w.first_child().expect("keeper");
    std::thread::sleep(Duration::from_millis(300));
    w.signal(libc::SIGKILL);
    let _ = w.wait(Duration::from_secs(1));
    let mut bad = Vec::new();
    if !wait_until(Duration::from_secs(1), || !alive(keeper)) {
        bad.push(format!(
            "the keeper {keeper} of a SIGKILLed waiting wrapper is still alive 1 s later"
        ));
    }
    assert_eq!(h.wait(Duration::from_secs(5)), Some(0));
    // Let a surviving keeper take the lease, start and end its command.
    wait_until(Duration::from_secs(4), || !alive(keeper));
    let s = format!("echo $CXC_FENCING_TOKEN > '{}'", p(&tok));
    let code = run_cmd("lease", &file, &["-w", "5"], &s).status().unwrap();
    assert!(code.success(), "{code}");
    let t = read(&tok).trim().to_string();
    if t != "2" {
        bad.push(format!(
            "the next run got token {t} (holder had 1): the dead wrapper's keeper took a claim"
        ));
    }
    bad
}

#[test]
fn control_wrapper_killed_while_waiting_ends_the_keeper() {
    let bad = wrapper_killed_while_waiting(Stdio::null);
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn wrapper_killed_while_waiting_with_stderr_a_broken_pipe_ends_the_keeper() {
    let bad = wrapper_killed_while_waiting(broken_pipe);
    assert!(bad.is_empty(), "{bad:#?}");
}

fn dev_full() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap(),
    )
}

#[test]
fn nonblock_conflict_exit_code_with_stderr_unwritable() {
    let d = tempfile::tempdir().unwrap();
    let mut bad = Vec::new();
    for kind in ["lease", "sem", "rwlock"] {
        let file = d.path().join(format!("f.{kind}"));
        let mut h = holder(kind, d.path(), &file, "3");
        for (name, stderr) in [
            ("/dev/null", Stdio::null as fn() -> Stdio),
            ("a broken pipe", broken_pipe),
            ("/dev/full", dev_full),
        ] {
            for (extra, want) in [(&["-n"][..], 1), (&["-n", "-E", "0"][..], 0)] {
                let st = run_cmd(kind, &file, extra, "echo OVERLAP")
                    .stderr(stderr())
                    .status()
                    .unwrap();
                if st.code() != Some(want) {
                    bad.push(format!(
                        "{kind} {extra:?}, stderr {name}: exit {:?}, want {want}",
                        st.code()
                    ));
                }
            }
        }
        h.signal(libc::SIGTERM);
        let _ = h.wait(Duration::from_secs(5));
    }
    if have_flock() {
        let f = d.path().join("flock");
        let hold = Kid::spawn(
            Command::new("flock")
                .arg(&f)
                .args(["sleep", "3"])
                .stdin(Stdio::null()),
        );
        std::thread::sleep(Duration::from_millis(200));
        let st = Command::new("flock")
            .args(["-n", "-E", "0"])
            .arg(&f)
            .arg("true")
            .stderr(broken_pipe())
            .status()
            .unwrap();
        assert_eq!(
            st.code(),
            Some(0),
            "flock -n -E 0 with stderr a broken pipe"
        );
        hold.signal(libc::SIGTERM);
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn elect_keeps_campaigning_with_stderr_a_broken_pipe() {
    let d = tempfile::tempdir().unwrap();
    let e = d.path().join("e.elect");
    let ledger = d.path().join("ledger");
    let script = format!("echo run >> '{}'", p(&ledger));
    let mut w = Kid::spawn(
        cxc(&[
            "elect",
            p(&e),
            "--restart-delay",
            "100ms",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(broken_pipe()),
    );
    let again = wait_until(Duration::from_secs(4), || {
        read(&ledger).lines().count() >= 2
    });
    let code = w.wait(Duration::ZERO);
    w.signal(libc::SIGTERM);
    let _ = w.wait(Duration::from_secs(5));
    assert!(
        again && code.is_none(),
        "elect ran its command {} time(s) and {}",
        read(&ledger).lines().count(),
        match code {
            Some(c) => format!("exited {c}"),
            None => "is still running".into(),
        }
    );
}

#[test]
fn elect_control_keeps_campaigning_with_stderr_null() {
    let d = tempfile::tempdir().unwrap();
    let e = d.path().join("e.elect");
    let ledger = d.path().join("ledger");
    let script = format!("echo run >> '{}'", p(&ledger));
    let mut w = Kid::spawn(&mut cxc(&[
        "elect",
        p(&e),
        "--restart-delay",
        "100ms",
        "--",
        "sh",
        "-c",
        &script,
    ]));
    let again = wait_until(Duration::from_secs(4), || {
        read(&ledger).lines().count() >= 2
    });
    let code = w.wait(Duration::ZERO);
    w.signal(libc::SIGTERM);
    let _ = w.wait(Duration::from_secs(5));
    assert!(again && code.is_none(), "{code:?}");
}

// ---------------------------------------------------------------------------------------
// 2. Signals the parent ignores.

/// `cmd` started with `sig` ignored (as `nohup` does for SIGHUP, and a non-interactive
/// shell for SIGINT of a background job).
fn ignoring(cmd: &mut Command, sig: i32) -> &mut Command {
    // SAFETY: signal(2) is async-signal-safe; the closure touches no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            libc::signal(sig, libc::SIG_IGN);
            Ok(())
        })
    }
}

#[test]
fn a_signal_the_parent_ignores_does_not_end_the_job() {
    let d = tempfile::tempdir().unwrap();
    let mut bad = Vec::new();
    for (name, sig) in [("SIGHUP", libc::SIGHUP), ("SIGINT", libc::SIGINT)] {
        let ledger = d.path().join(format!("ledger-{name}"));
        let script = format!("sleep 1; echo survived >> '{}'", p(&ledger));
        let file = d.path().join(format!("{name}.lease"));
        let mut w = Kid::spawn(ignoring(&mut run_cmd("lease", &file, &[], &script), sig));
        let mut f = have_flock().then(|| {
            let mut c = Command::new("flock");
            c.arg(d.path().join(format!("{name}.flock")))
                .args(["sh", "-c"])
                .arg(format!("sleep 1; echo flock-survived >> '{}'", p(&ledger)))
                .stdin(Stdio::null());
            Kid::spawn(ignoring(&mut c, sig))
        });
        std::thread::sleep(Duration::from_millis(300));
        w.signal(sig);
        if let Some(f) = &f {
            f.signal(sig);
        }
        let code = w.wait(Duration::from_secs(5));
        let fcode = f.as_mut().and_then(|f| f.wait(Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(200));
        let l = read(&ledger);
        if f.is_some() {
            assert!(
                l.contains("flock-survived") && fcode == Some(0),
                "flock control: {l:?} {fcode:?}"
            );
        }
        if !l.lines().any(|x| x == "survived") {
            bad.push(format!(
                "{name} ignored by the parent, sent to the wrapper: the job was ended, cxc \
                 exited {code:?} (flock exited {fcode:?}, its job survived)"
            ));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn a_blocked_mask_in_the_parent_still_lets_a_killed_wrapper_end_the_job() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("f.lease");
    let st = d.path().join("status");
    let script = format!(
        "grep -E '^Sig(Blk|Ign)' /proc/$$/status > '{}'; sleep 30",
        p(&st)
    );
    let mut c = run_cmd("lease", &file, &[], &script);
    // SAFETY: sigprocmask(2) and signal(2) are async-signal-safe; the set lives on this
    // closure's stack.
    unsafe {
        c.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGHUP);
            libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut w = Kid::spawn(&mut c);
    assert!(wait_until(Duration::from_secs(5), || read(&st)
        .lines()
        .count()
        == 2));
    // As under flock(1), the job inherits the caller's mask (SIGTERM blocked here): the
    // keeper's SIGTERM stays pending and its SIGKILL 2 s later ends the group.
    let blk = read(&st);
    eprintln!("the job's signal state: {blk}");
    w.signal(libc::SIGKILL);
    let _ = w.wait(Duration::from_secs(2));
    // The job ends by the SIGKILL 2 s after the SIGTERM: the lease frees then.
    let ok = cxc(&["lease", "run", p(&file), "-w", "4", "--", "true"])
        .status()
        .unwrap();
    assert!(
        ok.success(),
        "lease not free 4 s after the wrapper was killed: {ok}"
    );
}

// ---------------------------------------------------------------------------------------
// Closed standard descriptors, tiny limits.

/// `cmd` started with fds 0, 1 and 2 closed.
fn closed_stdio(cmd: &mut Command) -> &mut Command {
    // SAFETY: close(2) is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::close(0);
            libc::close(1);
            libc::close(2);
            Ok(())
        })
    }
}

#[test]
fn closed_stdio_never_points_output_at_the_file() {
    let d = tempfile::tempdir().unwrap();
    for kind in ["lease", "sem", "rwlock"] {
        let file = d.path().join(format!("f.{kind}"));
        let fds = d.path().join(format!("fds-{kind}"));
        let script = format!(
            "ls -l /proc/$$/fd > '{}'; echo OUTPUT-MARKER-34; echo ERROR-MARKER-34 >&2",
            p(&fds)
        );
        let st = closed_stdio(&mut run_cmd(kind, &file, &[], &script))
            .status()
            .unwrap();
        assert!(st.success(), "{kind}: {st}");
        let listing = read(&fds);
        let name = file.file_name().unwrap().to_str().unwrap();
        assert!(
            !listing.contains(name),
            "{kind}: the job holds the file: {listing}"
        );
        let bytes = std::fs::read(&file).unwrap();
        assert!(
            !bytes.windows(9).any(|w| w == b"MARKER-34"),
            "{kind}: output landed in the file"
        );
        // inspect with closed stdio only reads.
        let before = std::fs::read(&file).unwrap();
        let _ = closed_stdio(&mut cxc(&["inspect", p(&file)]))
            .status()
            .unwrap();
        assert_eq!(
            before,
            std::fs::read(&file).unwrap(),
            "{kind}: inspect wrote"
        );
        let out = cxc(&["inspect", p(&file)])
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        assert!(out.status.success(), "{kind}: inspect after: {out:?}");
        let again = run_cmd(kind, &file, &["-n"], "true").status().unwrap();
        assert!(again.success(), "{kind}: second run: {again}");
    }
}

/// The job: overlap judged by the kernel's flock on `side`, start/end in `ledger`.
fn judged_job(side: &Path, ledger: &Path) -> String {
    format!(
        "exec 3>>'{s}'; flock -n 3 || echo OVERLAP >> '{l}'; echo start >> '{l}'; sleep 0.3; \
         echo end >> '{l}'",
        s = p(side),
        l = p(ledger)
    )
}

fn with_nofile(cmd: &mut Command, n: u64) -> &mut Command {
    // SAFETY: setrlimit(2) is async-signal-safe; the struct lives on this closure's stack.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: n as libc::rlim_t,
                rlim_max: n as libc::rlim_t,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
            Ok(())
        })
    }
}

#[test]
fn a_tiny_fd_limit_fails_cleanly_or_runs_alone() {
    if !have_flock() {
        eprintln!("no flock(1): skipped");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let side = d.path().join("side");
    let mut outcomes = Vec::new();
    for n in 4..=16u64 {
        for behind in [false, true] {
            let file = d.path().join(format!("f{n}-{behind}.lease"));
            let ledger = d.path().join(format!("ledger{n}-{behind}"));
            let h = behind.then(|| {
                holder(
                    "lease",
                    d.path(),
                    &file,
                    &format!("0.4; echo held-end >> '{}'", p(&ledger)),
                )
            });
            let job = judged_job(&side, &ledger);
            let mut c = run_cmd("lease", &file, &[], &job);
            let code = Kid::spawn(with_nofile(&mut c, n)).wait(Duration::from_secs(10));
            if let Some(mut h) = h {
                assert_eq!(h.wait(Duration::from_secs(5)), Some(0), "n={n}: holder");
            }
            let l = read(&ledger);
            assert!(!l.contains("OVERLAP"), "n={n}: overlap: {l}");
            match code {
                Some(0) => assert!(l.contains("start\nend"), "n={n}: {l:?}"),
                Some(2) => assert!(!l.contains("start"), "n={n}: exit 2 but ran: {l:?}"),
                other => panic!("n={n} behind={behind}: exit {other:?}"),
            }
            if behind && code == Some(0) {
                assert!(
                    l.starts_with("held-end"),
                    "n={n}: ran before the holder ended"
                );
            }
            let free = cxc(&["lease", "run", p(&file), "-w", "3", "--", "true"])
                .status()
                .unwrap();
            assert!(free.success(), "n={n}: lease left held");
            outcomes.push((n, behind, code));
        }
    }
    eprintln!("(limit, behind a holder, exit): {outcomes:?}");
}

#[test]
fn a_pids_cgroup_limit_fails_cleanly_or_runs_alone() {
    let root = Path::new("/sys/fs/cgroup/pids");
    if !root.join("cgroup.procs").exists() || !have_flock() {
        eprintln!("no cgroup-v1 pids controller or flock(1): skipped");
        return;
    }
    let cg = root.join(format!("cxc-attack34-{}", std::process::id()));
    if std::fs::create_dir(&cg).is_err() {
        eprintln!("cannot make a pids cgroup (not root?): skipped");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let side = d.path().join("side");
    let mut outcomes = Vec::new();
    for max in 1..=6u32 {
        for behind in [false, true] {
            std::fs::write(cg.join("pids.max"), max.to_string()).unwrap();
            let file = d.path().join(format!("f{max}-{behind}.lease"));
            let ledger = d.path().join(format!("ledger{max}-{behind}"));
            let h = behind.then(|| holder("lease", d.path(), &file, "0.4"));
            let job = judged_job(&side, &ledger);
            let inner = format!(
                "echo $$ > '{}'; exec '{CXC}' lease run '{}' -- sh -c \"$0\"",
                p(&cg.join("cgroup.procs")),
                p(&file)
            );
            let mut c = Command::new("sh");
            c.args(["-c", &inner, &job])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let code = Kid::spawn(&mut c).wait(Duration::from_secs(10));
            if let Some(mut h) = h {
                assert_eq!(h.wait(Duration::from_secs(5)), Some(0), "max={max}: holder");
            }
            std::thread::sleep(Duration::from_millis(400));
            let l = read(&ledger);
            assert!(!l.contains("OVERLAP"), "max={max}: overlap: {l}");
            assert!(
                matches!(code, Some(0 | 2 | 126)),
                "max={max} behind={behind}: exit {code:?}"
            );
            let free = cxc(&["lease", "run", p(&file), "-w", "3", "--", "true"])
                .status()
                .unwrap();
            assert!(free.success(), "max={max}: lease left held");
            outcomes.push((max, behind, code));
        }
    }
    std::fs::write(cg.join("pids.max"), "max").unwrap();
    wait_until(Duration::from_secs(5), || {
        read(&cg.join("cgroup.procs")).trim().is_empty()
    });
    let _ = std::fs::remove_dir(&cg);
    eprintln!("(pids.max, behind a holder, exit): {outcomes:?}");
}

// ---------------------------------------------------------------------------------------
// Odd paths, umask, deleted cwd.

#[test]
fn odd_paths_umask_and_a_deleted_cwd_fail_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let ledger = d.path().join("ledger");
    let job = format!("echo ran >> '{}'", p(&ledger));
    let fifo = d.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let dirp = d.path().join("dir");
    std::fs::create_dir(&dirp).unwrap();
    let dangling = d.path().join("dangling");
    std::os::unix::fs::symlink(d.path().join("nowhere"), &dangling).unwrap();
    for kind in ["lease", "sem", "rwlock"] {
        for path in [&fifo, &dirp, Path::new("/dev/null"), &dangling] {
            let code = Kid::spawn(&mut run_cmd(kind, path, &[], &job)).wait(Duration::from_secs(5));
            assert_eq!(code, Some(2), "{kind} on {}", path.display());
        }
    }
    assert!(!d.path().join("nowhere").exists());
    assert_eq!(read(&ledger), "", "something ran");

    // umask 0777 when the file is made.
    let file = d.path().join("umask.lease");
    let mut c = run_cmd("lease", &file, &[], "true");
    // SAFETY: umask(2) is async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            libc::umask(0o777);
            Ok(())
        });
    }
    assert!(c.status().unwrap().success());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "mode {mode:o}");
    assert!(
        run_cmd("lease", &file, &["-n"], "true")
            .status()
            .unwrap()
            .success()
    );

    // A deleted working directory, relative path.
    let gone = d.path().join("gone");
    let script = format!(
        "mkdir '{g}' && cd '{g}' && rmdir '{g}' && exec '{CXC}' lease run rel.lease -- sh -c \"$0\"",
        g = p(&gone)
    );
    let code = Command::new("sh")
        .args(["-c", &script, &job])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .code();
    assert_eq!(code, Some(2));
    assert_eq!(read(&ledger), "", "something ran");
}

// ---------------------------------------------------------------------------------------
// Environment: PATH without `sh`; stdout a broken pipe.

#[test]
fn dash_c_runs_without_sh_on_path() {
    let d = tempfile::tempdir().unwrap();
    let ledger = d.path().join("ledger");
    let line = format!("echo ran >> '{}'", p(&ledger));
    let mut bad = Vec::new();
    for kind in ["lease", "sem", "rwlock"] {
        let file = d.path().join(format!("f.{kind}"));
        let mut args = run_args(kind, &file);
        args.extend(["-c".into(), line.clone()]);
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let st = cxc(&a).env("PATH", "/nonexistent").status().unwrap();
        if st.code() != Some(0) {
            bad.push(format!(
                "{kind} run -c, PATH=/nonexistent: exit {:?}",
                st.code()
            ));
        }
    }
    if Path::new("/usr/bin/flock").exists() {
        let st = Command::new("/usr/bin/flock")
            .arg(d.path().join("f.flock"))
            .args(["-c", "true"])
            .env("PATH", "/nonexistent")
            .env_remove("SHELL")
            .status()
            .unwrap();
        assert!(st.success(), "flock control: {st}");
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn create_with_stdout_a_broken_pipe_exits_0() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("f.lease");
    let st = cxc(&["create", "lease", p(&file)])
        .stdout(broken_pipe())
        .status()
        .unwrap();
    assert!(file.exists());
    assert_eq!(
        st.code(),
        Some(0),
        "the file was made, the exit says it failed"
    );
}

// ---------------------------------------------------------------------------------------
// RLIMIT_FSIZE.

#[test]
fn a_file_size_limit_fails_cleanly_when_the_file_is_made() {
    let d = tempfile::tempdir().unwrap();
    let ledger = d.path().join("ledger");
    let job = format!("echo ran >> '{}'", p(&ledger));
    let mut bad = Vec::new();
    for kind in ["lease", "sem", "rwlock"] {
        let file = d.path().join(format!("f.{kind}"));
        let mut c = run_cmd(kind, &file, &[], &job);
        // SAFETY: setrlimit(2) is async-signal-safe; the struct lives on this closure's
        // stack.
        unsafe {
            c.pre_exec(|| {
                let r = libc::rlimit {
                    rlim_cur: 0,
                    rlim_max: libc::RLIM_INFINITY,
                };
                libc::setrlimit(libc::RLIMIT_FSIZE, &r);
                Ok(())
            });
        }
        let code = c.status().unwrap().code();
        if !matches!(code, Some(0 | 2)) {
            bad.push(format!(
                "{kind}: exit {code:?} (want 0, or 2 with a message); ran: {}",
                read(&ledger).contains("ran")
            ));
        }
    }
    let litter: Vec<String> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("tmp"))
        .collect();
    if !litter.is_empty() {
        bad.push(format!("temporary files left behind: {litter:?}"));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}
