//! The re-execution of this test binary in a role: [`RoleCommand`] and [`spawn_role`].

use std::ffi::OsStr;
use std::process::Command;

use crate::proc::Proc;
use crate::role::{ROLE_VAR, arg_var};

/// Builds the re-execution of this test binary running only test `test` (exact name,
/// with its module path for unit tests) in role `role`.
///
/// The child gets [`ROLE_VAR`]` = role`, its arguments as environment variables (read
/// them with [`crate::arg`]), and `--exact TEST --include-ignored --nocapture
/// --test-threads=1` (so a test marked `#[ignore]` runs in the child too: the parent
/// running it is the decision).
///
/// ```no_run
/// # let path = std::path::Path::new("f");
/// use cxc_testkit::RoleCommand;
/// let child = RoleCommand::new("race_test", "racer").arg("path", path).arg("start_ns", "123").spawn();
/// ```
#[derive(Debug)]
pub struct RoleCommand {
    cmd: Command,
    test: String,
    role: String,
    /// `key=value` of each role argument, for failure messages.
    args: Vec<String>,
}

impl RoleCommand {
    /// This test binary, to run `test` in `role`.
    ///
    /// # Panics
    ///
    /// If the path of the running executable cannot be found.
    pub fn new(test: &str, role: &str) -> Self {
        let exe = std::env::current_exe().expect("the path of this test binary");
        let mut cmd = Command::new(exe);
        cmd.args([
            "--exact",
            test,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_VAR, role);
        RoleCommand {
            cmd,
            test: test.to_owned(),
            role: role.to_owned(),
            args: Vec::new(),
        }
    }

    /// Passes role argument `key` (ASCII letters, digits, `_`), read in the child with
    /// [`crate::arg`] or [`crate::path_arg`].
    pub fn arg(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        let value = value.as_ref();
        self.args.push(format!("{key}={}", value.to_string_lossy()));
        self.cmd.env(arg_var(key), value);
        self
    }

    /// Sets any other environment variable of the child.
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.cmd.env(key, value);
        self
    }

    /// The command itself, for a parent that must not start threads (a [`Proc`] reads
    /// the child's output on threads; e.g. a process that unshared its pid namespace
    /// cannot create threads). Its stdio is inherited unless set.
    pub fn into_command(self) -> Command {
        self.cmd
    }

    /// Starts the child; see [`Proc`]. Failure messages name the test, the role and the
    /// role arguments.
    pub fn spawn(self) -> Proc {
        let mut what = format!("{} as {}", self.test, self.role);
        if !self.args.is_empty() {
            what = format!("{what} ({})", self.args.join(" "));
        }
        let mut p = Proc::spawn(self.cmd, &what);
        p.test = Some(self.test);
        p
    }
}

/// [`RoleCommand::new`]`(test, role).spawn()`: a child with no role arguments.
pub fn spawn_role(test: &str, role: &str) -> Proc {
    RoleCommand::new(test, role).spawn()
}
