//! Test kit for the cxc workspace: everything a multi-process test needs, written once.
//!
//! A multi-process test re-executes its own test binary, running only itself
//! (`--exact NAME`), with a *role* in the environment. The same test function then plays
//! the parent (no role) or a child (some role):
//!
//! - [`RoleCommand`] / [`spawn_role`] start the child; [`role`], [`in_role`], [`arg`],
//!   [`path_arg`] and [`report`] are the child's side.
//! - [`Proc`] is the handle on any child process: SIGKILL, SIGSTOP/SIGCONT, waits that
//!   never hang a test, the child's report lines, and a kill on drop so a panicking test
//!   leaves no orphan. [`Proc::spawn`] wraps any [`std::process::Command`].
//! - [`fields`] parses a `key=value key=value` report.
//! - [`wait_until`] and [`wait_for_path`] poll a condition up to a deadline;
//!   [`child_wait_for_path`] is a child's wait for its parent's marker; [`serial`] keeps
//!   the tests of one binary that must not overlap apart.
//! - [`num`] and [`flag`] read one field of a report; [`sleep_forever`] keeps a child
//!   holding until it is killed.
//! - [`find_program`] finds a program a test runs; [`all_threads_in_state`] reads a
//!   process's threads' states.
//! - [`exit_main_thread`] ends the main thread alone (the `pthread_exit` pattern).
//! - [`Freezer`] stops processes without a signal (a cgroup v1 freezer group);
//!   [`use_up_fds`] and [`fd_free`] run a process out of descriptors; [`is_root`],
//!   [`skip`] and the `skip_without_*` checks ([`skip_without_freezer`],
//!   [`skip_without_timens`], [`skip_without_unshare_timens`]) print SKIPPED for a test
//!   that needs what the machine does not give.
//! - [`mono_ns`] is one clock for all processes; [`read_word`] reads a shared word with
//!   `pread`; [`sigkill`] kills a raw pid.
//! - [`sealed`] and [`intact`] make and check a multi-word payload whose torn copies
//!   are detected.
//! - [`Rng`] is the one seeded generator (SplitMix64); [`Rng::for_test`] prints its seed
//!   (shown when the test fails) and takes it back from [`SEED_VAR`] to replay a run.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//! use cxc_testkit::{RoleCommand, fields, path_arg, report, role};
//!
//! #[test]
//! fn two_processes_agree() {
//!     if role().as_deref() == Some("writer") {
//!         let path = path_arg("path");
//!         std::fs::write(&path, "42").unwrap();
//!         report("wrote=42");
//!         return;
//!     }
//!     let dir = std::env::temp_dir().join("example");
//!     let mut child = RoleCommand::new("two_processes_agree", "writer")
//!         .arg("path", &dir)
//!         .spawn();
//!     let reports = child.finish(Duration::from_secs(60));
//!     assert_eq!(fields(&reports[0])["wrote"], "42");
//! }
//! ```
//!
//! This crate is for tests and tools of the workspace only (`publish = false`).

// Only `half_exit` may use `unsafe` (a signal handler and a thread-only exit).
#![deny(unsafe_code)]

mod command;
mod half_exit;
mod host;
mod hostile;
mod payload;
mod proc;
mod rng;
mod role;
mod wait;

pub use command::{RoleCommand, spawn_role};
pub use half_exit::{HALF_EXIT_SIGNAL, exit_main_thread, main_thread_exited};
pub use host::{
    all_threads_in_state, find_program, mono_ns, process_cpu, read_word, sigkill, thread_cpu,
};
pub use hostile::{
    FREEZER, Freezer, PIDS, allow_threads, fd_free, forbid_threads, is_root, pids_group, skip,
    skip_without_freezer, skip_without_pids_cgroup, skip_without_timens,
    skip_without_unshare_timens, use_up_fds,
};
pub use payload::{intact, sealed};
pub use proc::Proc;
pub use rng::{Rng, SEED_VAR, mix};
pub use role::{
    ARG_VAR_PREFIX, REPORT_PREFIX, ROLE_VAR, arg, fields, flag, in_role, num, path_arg, report,
    role, sleep_forever, try_arg,
};
pub use wait::{child_wait_for_path, serial, wait_for_path, wait_until};
