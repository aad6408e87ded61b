//! `cargo xtask torture`: kill, pause and restart worker processes that hammer the lease,
//! the heartbeat table (with a watchdog), the semaphore, the shared cell and the rwlock, and
//! check the protocol invariants live and at the end (docs/RELIABILITY.md).
//!
//! - `torture` (what users run): builds xtask in release and runs `torture-supervise`
//!   with the same arguments (a debug build is too slow to produce contention).
//! - `torture-supervise`: the supervisor ([`supervisor`]).
//! - `torture-worker` (hidden): one worker process, spawned by the supervisor.

mod cell;
mod control;
mod heartbeat;
mod lease;
mod opts;
mod rwlock;
mod semaphore;
mod shm;
mod supervisor;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use opts::Role;
pub(crate) use opts::{Args, Options, WorkerOptions};

/// `cargo xtask torture [..]`.
pub(crate) fn run(args: Args) -> ExitCode {
    let opts = Options::from(args);
    if !cfg!(debug_assertions) {
        return supervisor::supervise(opts);
    }
    // Re-run ourselves from a release build; the seed is fixed here so it is printed once.
    let mut build = super::cargo();
    build
        .current_dir(super::root())
        .args(["build", "--release", "--quiet", "-p", "xtask"]);
    if super::run(build) != ExitCode::SUCCESS {
        return ExitCode::FAILURE;
    }
    let exe = target_dir()
        .join("release")
        .join(format!("xtask{}", std::env::consts::EXE_SUFFIX));
    let mut cmd = Command::new(&exe);
    cmd.arg("torture-supervise").args(opts.to_args());
    match cmd.status() {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => ExitCode::from(s.code().map_or(1, |c| c.clamp(1, 255) as u8)),
        Err(e) => {
            eprintln!("xtask torture: cannot run {}: {e}", exe.display());
            ExitCode::FAILURE
        }
    }
}

/// The target directory cargo builds into, as `cargo metadata` reports it (so
/// `CARGO_TARGET_DIR`, `build.target-dir` and the default all work).
fn target_dir() -> PathBuf {
    let mut cmd = super::cargo();
    cmd.current_dir(super::root())
        .args(["metadata", "--format-version", "1", "--no-deps"]);
    let from_metadata = cmd.output().ok().and_then(|o| {
        let meta: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
        Some(PathBuf::from(meta.get("target_directory")?.as_str()?))
    });
    from_metadata.unwrap_or_else(|| {
        let dir =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| "target".into(), PathBuf::from);
        super::root().join(dir)
    })
}

/// `xtask torture-supervise [..]`.
pub(crate) fn supervise(args: Args) -> ExitCode {
    supervisor::supervise(Options::from(args))
}

/// `xtask torture-worker --role R --dir D --seed S --id K --inc N` (hidden).
pub(crate) fn worker(o: WorkerOptions) -> ExitCode {
    let who = match o.role {
        Role::Lease => format!("lease worker {}.{} ({})", o.id, o.inc, o.lease_mode.name()),
        r => format!("{} worker {}.{}", r.name(), o.id, o.inc),
    };
    let ctx = match control::Ctx::open(&o.dir, who) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xtask torture-worker: {e}");
            return ExitCode::from(2);
        }
    };
    // Exit if the supervisor goes away (e.g. Ctrl-C), instead of running forever.
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(200));
            if std::os::unix::process::parent_id() != parent {
                std::process::exit(3);
            }
        }
    });
    if o.open_only {
        return match lease::open_only(&o.dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("xtask torture-worker: {e}");
                ExitCode::from(2)
            }
        };
    }
    if o.role == Role::Lease && o.lease_mode.half_exited() {
        // The workers run on a spawned thread, which ends the process with its result;
        // the main thread exits now, leaving a half-exited but live process.
        let spawned = std::thread::Builder::new()
            .name("lease-main".into())
            .spawn(move || {
                let code = match lease::process(&ctx, &o) {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("xtask torture-worker ({}): {e}", ctx.dir.display());
                        2
                    }
                };
                std::process::exit(code)
            });
        if let Err(e) = spawned {
            eprintln!("xtask torture-worker: cannot spawn the lease thread: {e}");
            return ExitCode::from(2);
        }
        exit_main_thread();
    }
    let rng = cxc_testkit::Rng::derive(o.seed, o.role.code(), o.id as u64, o.inc);
    let r = match o.role {
        Role::Lease => lease::process(&ctx, &o),
        Role::Heartbeat => heartbeat::worker(&ctx, rng),
        Role::Semaphore => semaphore::worker(&ctx, rng, o.id),
        Role::Cell => cell::worker(&ctx, rng, o.id, o.inc),
        Role::Rwlock => rwlock::worker(&ctx, rng, o.id),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask torture-worker ({}): {e}", ctx.dir.display());
            ExitCode::from(2)
        }
    }
}

/// Ends the calling thread (the main thread) alone; the process lives on in its other
/// threads, and `/proc/PID/stat` shows the main thread as a zombie (`Z`).
///
/// Not `pthread_exit`: glibc implements it by a forced unwind, which the runtime's
/// `catch_unwind` around `main` stops and then aborts the process on ("FATAL: exception
/// not rethrown"). The raw `exit` system call ends the thread without unwinding.
fn exit_main_thread() -> ! {
    // SAFETY: `SYS_exit` (unlike `exit_group`) terminates only the calling thread and
    // never returns; it takes one integer argument, the exit code. Nothing unwinds, so no
    // destructor of this thread runs: what it owns is leaked, not freed, and the other
    // threads borrow nothing from its stack (the lease thread owns everything it uses,
    // moved into it, or uses statics). This thread holds no lock at this point, so no
    // other thread can wait on one it would never release.
    unsafe {
        libc::syscall(libc::SYS_exit, 0);
    }
    unreachable!("SYS_exit returned")
}
