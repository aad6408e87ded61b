//! The kit re-executing this test binary for real: roles and arguments reach the child,
//! reports come back, failures and hangs of a child fail the parent, signals work, and a
//! dropped handle kills its child.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use cxc_testkit::{
    Proc, RoleCommand, arg, fields, in_role, path_arg, report, role, spawn_role, try_arg,
    wait_for_path, wait_until,
};
use rustix::process::{Pid, test_kill_process};

const T: Duration = Duration::from_secs(60);

/// The error message of a panic in `f`.
fn panic_message(f: impl FnOnce()) -> String {
    let e = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    e.downcast_ref::<String>()
        .cloned()
        .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// True while a process with this pid exists.
/// A child of `test` in `role` that reports `line`, then sleeps until killed (600 s at
/// most). In the parent: starts it, waits for its report and returns it with its pid. In
/// the child: plays the role and returns `None`.
fn sleeping_child(test: &str, role: &str, line: &str) -> Option<(Proc, u32)> {
    if in_role(role) {
        report(line);
        std::thread::sleep(Duration::from_secs(600));
        return None;
    }
    let mut child = spawn_role(test, role);
    assert_eq!(child.next_report(T), line);
    let pid = child.pid();
    Some((child, pid))
}

fn alive(pid: u32) -> bool {
    test_kill_process(Pid::from_raw(pid as i32).expect("non-zero pid")).is_ok()
}

/// One-letter scheduler state of `pid` (`T` when stopped).
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    after.chars().next().expect("state")
}

#[test]
fn child_gets_role_and_arguments_and_reports_back() {
    if in_role("echo") {
        let path = path_arg("path");
        std::fs::write(&path, arg("word")).unwrap();
        report(format!("role={} word={}", role().unwrap(), arg("word")));
        report(format!("missing={}", try_arg("nope").is_none()));
        return;
    }
    assert_eq!(role(), None);
    let dir = std::env::temp_dir().join(format!("cxc-testkit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("echo");
    let mut child = RoleCommand::new("child_gets_role_and_arguments_and_reports_back", "echo")
        .arg("path", &path)
        .arg("word", "hello")
        .spawn();
    let first = child.next_report(T);
    let f = fields(&first);
    assert_eq!((f["role"], f["word"]), ("echo", "hello"), "{first}");
    assert_eq!(child.finish(T), ["missing=true"]);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "hello");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn failing_child_fails_finish_with_its_output() {
    if in_role("fail") {
        panic!("the child's own assertion");
    }
    let mut child = RoleCommand::new("failing_child_fails_finish_with_its_output", "fail")
        .arg("case", "c7")
        .spawn();
    let msg = panic_message(|| drop(child.finish(T)));
    assert!(msg.contains("failed"), "{msg}");
    assert!(msg.contains("as fail (case=c7)"), "{msg}");
    assert!(msg.contains("the child's own assertion"), "{msg}");
}

#[test]
fn wrong_test_name_is_reported() {
    let mut child = spawn_role("no_such_test", "any");
    let msg = panic_message(|| drop(child.finish(T)));
    assert!(msg.contains("ran no test named \"no_such_test\""), "{msg}");
}

#[test]
fn hung_child_is_killed_at_the_timeout() {
    let test = "hung_child_is_killed_at_the_timeout";
    let Some((mut child, pid)) = sleeping_child(test, "hang", "hanging") else {
        return;
    };
    let msg = panic_message(|| drop(child.finish(Duration::from_millis(100))));
    assert!(msg.contains("still running after"), "{msg}");
    assert!(!alive(pid), "the hung child is still there");
    // The status of the kill is kept.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&child.try_wait().unwrap()),
        Some(9)
    );
}

#[test]
fn next_report_times_out_instead_of_hanging() {
    if in_role("quiet") {
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let mut child = spawn_role("next_report_times_out_instead_of_hanging", "quiet");
    let msg = panic_message(|| drop(child.next_report(Duration::from_millis(100))));
    assert!(msg.contains("no report within"), "{msg}");
    assert_eq!(child.wait_timeout(Duration::from_millis(10)), None);
}

#[test]
fn stop_cont_and_kill() {
    if in_role("ticker") {
        for i in 0.. {
            report(format!("tick={i}"));
            std::thread::sleep(Duration::from_millis(5));
        }
        return;
    }
    let mut child = spawn_role("stop_cont_and_kill", "ticker");
    child.next_report(T);
    let pid = child.pid();
    child.stop();
    assert!(
        wait_until(Duration::from_secs(10), || state(pid) == 'T'),
        "not stopped"
    );
    child.cont();
    assert!(
        wait_until(Duration::from_secs(10), || state(pid) != 'T'),
        "not resumed"
    );
    child.next_report(T);
    child.kill();
    let msg = panic_message(|| drop(child.finish(T)));
    assert!(msg.contains("killed by signal 9"), "{msg}");
    assert!(!alive(pid));
}

#[test]
fn dropping_the_handle_kills_the_child() {
    let Some((child, pid)) = sleeping_child("dropping_the_handle_kills_the_child", "sleeper", "up")
    else {
        return;
    };
    assert!(alive(pid));
    drop(child);
    assert!(!alive(pid), "dropped child {pid} still exists");
}

#[test]
fn any_command_and_marker_files() {
    let dir = std::env::temp_dir().join(format!("cxc-testkit-sh-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let marker = dir.join("marker");
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        "sleep 0.05; echo out; echo err >&2; touch \"$1\"; exit 3",
        "sh",
    ])
    .arg(&marker);
    let mut p = Proc::spawn(cmd, "sh");
    assert!(wait_for_path(&marker, T), "marker never appeared");
    let status = p.wait_timeout(T).expect("sh exited");
    assert_eq!(status.code(), Some(3));
    let msg = panic_message(|| drop(p.finish(T)));
    assert!(msg.contains("failed"), "{msg}");
    assert_eq!(p.stdout(), "out\n");
    assert_eq!(p.stderr(), "err\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn output_of_a_chatty_command_is_complete() {
    // More than a pipe holds: the child must not block on a full pipe.
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        "head -c 1000000 /dev/zero | tr '\\0' x; echo; echo done >&2",
    ]);
    let out = Proc::spawn(cmd, "chatty sh").output(T);
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 1_000_001);
    assert!(out.stdout[..1_000_000].iter().all(|&b| b == b'x'));
    assert_eq!(out.stderr, b"done\n");
}

#[test]
#[ignore = "a role target only: run by ignored_tests_run_in_the_child"]
fn ignored_role_target() {
    if in_role("ignored") {
        report("ran=yes");
    }
}

#[test]
fn ignored_tests_run_in_the_child() {
    let mut child = spawn_role("ignored_role_target", "ignored");
    assert_eq!(child.finish(T), ["ran=yes"]);
}

#[test]
fn reports_bypass_output_capture() {
    if in_role("captured") {
        println!("not a report");
        report("seen=1");
        return;
    }
    // Without --nocapture, libtest holds back (and, as the test passes, drops) what
    // `println!` prints; the report still arrives.
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "reports_bypass_output_capture",
        "--test-threads=1",
    ])
    .env(cxc_testkit::ROLE_VAR, "captured");
    let mut child = Proc::spawn(cmd, "captured child");
    assert_eq!(child.finish(T), ["seen=1"]);
    assert!(
        child.stdout().contains("running 1 test"),
        "{}",
        child.stdout()
    );
    assert!(
        !child.stdout().contains("not a report"),
        "{}",
        child.stdout()
    );
}
