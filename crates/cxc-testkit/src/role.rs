//! The child's side of a role: which role it plays, its arguments, and its reports.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;

/// Environment variable naming the role a re-executed test binary plays.
pub const ROLE_VAR: &str = "CXC_TEST_ROLE";
/// Prefix of the environment variables carrying role arguments: argument `path` is
/// `CXC_TEST_ARG_PATH`.
pub const ARG_VAR_PREFIX: &str = "CXC_TEST_ARG_";
/// Prefix of a report line on a child's stdout (see [`report`]).
pub const REPORT_PREFIX: &str = "CXC-REPORT ";

/// The role this process was started in, `None` in the parent (a normal test run).
pub fn role() -> Option<String> {
    std::env::var(ROLE_VAR).ok()
}

/// True if this process was started in role `name`.
///
/// ```
/// assert!(!cxc_testkit::in_role("writer")); // a plain test run plays no role
/// ```
pub fn in_role(name: &str) -> bool {
    role().as_deref() == Some(name)
}

/// The variable that carries role argument `key`.
pub(crate) fn arg_var(key: &str) -> String {
    assert!(
        !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
        "role argument names are ASCII letters, digits and `_`, found {key:?}"
    );
    format!("{ARG_VAR_PREFIX}{}", key.to_ascii_uppercase())
}

/// Role argument `key` as the parent passed it ([`crate::RoleCommand::arg`]), if any.
pub fn try_arg(key: &str) -> Option<OsString> {
    std::env::var_os(arg_var(key))
}

/// Role argument `key` as UTF-8.
///
/// # Panics
///
/// If the parent did not pass it or it is not UTF-8 (a harness bug, not a test result).
pub fn arg(key: &str) -> String {
    try_arg(key)
        .unwrap_or_else(|| panic!("role {:?} started without argument {key:?}", role()))
        .into_string()
        .unwrap_or_else(|v| panic!("role argument {key:?} is not UTF-8: {v:?}"))
}

/// Role argument `key` as a path.
///
/// # Panics
///
/// If the parent did not pass it.
pub fn path_arg(key: &str) -> PathBuf {
    try_arg(key)
        .unwrap_or_else(|| panic!("role {:?} started without argument {key:?}", role()))
        .into()
}

/// Prints one report line for the parent ([`crate::Proc::next_report`],
/// [`crate::Proc::finish`]): [`REPORT_PREFIX`] then `line`, flushed at once. A report is
/// one line; by convention `key=value` pairs separated by spaces (see [`fields`]).
///
/// It writes to the process's stdout directly, not through `println!`, so the test
/// harness's output capture never holds it back, with or without `--nocapture`.
pub fn report(line: impl Display) {
    let line = line.to_string();
    debug_assert!(!line.contains('\n'), "a report is one line: {line:?}");
    let mut out = std::io::stdout().lock();
    // A parent that went away cannot read it anyway.
    let _ = writeln!(out, "{REPORT_PREFIX}{line}");
    let _ = out.flush();
}

/// The `key=value` pairs of a report, split on whitespace; words without `=` are skipped.
///
/// ```
/// let f = cxc_testkit::fields("origin=Created pid=7 done");
/// assert_eq!(f["origin"], "Created");
/// assert_eq!(f["pid"], "7");
/// assert_eq!(f.len(), 2);
/// ```
pub fn fields(line: &str) -> HashMap<&str, &str> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect()
}

/// Number `key` of a report (see [`fields`]).
///
/// # Panics
///
/// If the report has no `key` or its value is not a `u64` (the child broke the
/// protocol, which fails the test).
///
/// ```
/// assert_eq!(cxc_testkit::num("held=3 pid=7", "held"), 3);
/// ```
pub fn num(line: &str, key: &str) -> u64 {
    fields(line)
        .get(key)
        .unwrap_or_else(|| panic!("report {line:?} has no {key}"))
        .parse()
        .unwrap_or_else(|e| panic!("report {line:?}: {key}: {e}"))
}

/// Boolean `key` of a report (`true` or `false`, see [`fields`]).
///
/// # Panics
///
/// If the report has no `key` or its value is neither `true` nor `false`.
///
/// ```
/// assert!(cxc_testkit::flag("owner=true", "owner"));
/// assert!(!cxc_testkit::flag("owner=false", "owner"));
/// ```
pub fn flag(line: &str, key: &str) -> bool {
    match fields(line).get(key).copied() {
        Some("true") => true,
        Some("false") => false,
        other => panic!("report {line:?}: {key} is {other:?}, not a boolean"),
    }
}

/// Sleeps until killed: a child that must keep what it holds (a claim, a permit, a
/// mapping) until its parent kills it.
pub fn sleep_forever() -> ! {
    loop {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

/// If this process was started in a role, plays it and exits: each listed function
/// `role_NAME` plays role `NAME`, and an unknown role panics. A normal test run (no
/// role) goes on.
///
/// ```
/// fn role_writer() {}
/// fn role_reader() {}
/// // In the parent (a plain test run) this does nothing.
/// cxc_testkit::play_role!(role_writer, role_reader);
/// ```
#[macro_export]
macro_rules! play_role {
    ($($f:ident),+ $(,)?) => {
        if let Some(role) = $crate::role() {
            $(
                if Some(role.as_str()) == stringify!($f).strip_prefix("role_") {
                    $f();
                    std::process::exit(0);
                }
            )+
            panic!("unknown child role {role:?}");
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arg_names_map_to_upper_case_variables() {
        assert_eq!(arg_var("path"), "CXC_TEST_ARG_PATH");
        assert_eq!(arg_var("start_ns2"), "CXC_TEST_ARG_START_NS2");
    }

    #[test]
    #[should_panic(expected = "role argument names")]
    fn arg_names_are_checked() {
        arg_var("a=b");
    }

    #[test]
    fn fields_skip_words_without_equals() {
        let f = fields("  a=1  b=  c x=y=z ");
        assert_eq!(f.len(), 3);
        assert_eq!(f["a"], "1");
        assert_eq!(f["b"], "");
        assert_eq!(f["x"], "y=z");
    }
}
