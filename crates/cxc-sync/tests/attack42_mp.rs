#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack42: judges whose view of other processes is restricted. The library decides
//! whether a holder is alive, dead or exiting from OS facts (pidfd, `/proc/PID/stat` and
//! `/proc/PID/task`, the pid namespace, the boot id). Here the judging process (a lease
//! claimant, a semaphore reclaimer, an rwlock writer evicting readers, a failover
//! watchdog) sees a `/proc` that does not tell the truth about the holder, while the
//! holder is a live process the whole time (the parent checks it with `kill(pid, 0)` as
//! root, and the holder itself reports afterwards):
//!
//! 1. **`hidepid` judge, pidfs identities.** The judge runs in its own mount namespace
//!    with `/proc` mounted `hidepid=noaccess` or `hidepid=invisible`, as uid 65534, the
//!    holder as root. It must not take the lease, reclaim the semaphore's permit, evict
//!    the reader, nor report the heartbeat worker dead.
//! 2. **`hidepid=invisible` judge and a holder that execs.** The exec ends the holder's
//!    sentinel thread, so its slot carries the sentinel's mark; "exiting" then needs
//!    every thread of `/proc/PID/task` in the kernel's exit. A claimant that cannot see
//!    the holder's `/proc/PID` at all must not conclude that.
//! 3. **`hidepid=invisible` judge, fallback identities** (pid + start time, the kernels
//!    without pidfs; forced with `CXC_IDENTITY_FALLBACK=1`).
//! 4. **A judge with a `/proc` of another pid namespace.** A host process that entered
//!    only the mount namespace of a "container" (a new pid namespace with its own
//!    `/proc`: `nsenter -m`) sees a `/proc` in which it does not exist: `/proc/self`
//!    dangles, so its pid namespace is unknown (0), while the boot id is readable. The
//!    holders live in the container and made the semaphore and rwlock files there.
//! 5. **A holder with a `/proc` of another pid namespace**, the other side of 4: the
//!    holder (host process, host files) records pid namespace 0; the judge is a plain
//!    root process of the host with the host's `/proc`.
//!
//! Results (this kernel has pidfs), each 5 of 5 runs on the tree before the fixes:
//! - 1 held (lease, semaphore, rwlock, watchdog; also a judge as another uid with the
//!   host's `/proc`, where `kill(pid, 0)` gives `EPERM`), and held on the fallback path
//!   under `hidepid=noaccess` (`EACCES` = cannot tell).
//! - 2 BROKE: the invisible judge took the live exec'd holder's lease over "as
//!   exiting": `threads_stopped` got `ENOENT` for `/proc/PID/task`, found
//!   `/proc/self/stat`, and answered "gone", i.e. every thread stopped.
//! - 3 BROKE: with fallback identities the invisible judge took the lease, reclaimed the
//!   permit, evicted the reader and had the watchdog report the worker dead
//!   (`/proc/PID/stat` `ENOENT` + `/proc/self/stat` present = "no such process").
//! - 4 BROKE for the semaphore and the rwlock: the namespace check at `open` let an
//!   unknown (0) namespace through, and the judge then looked the container's pids up in
//!   its own namespace (the holder is pid 1 there: the host's init) and reclaimed the
//!   live holder's permit / read hold.
//! - 5 BROKE for the semaphore and the rwlock: the holder's tag hashed pid namespace 0,
//!   the plain judge hashed its own namespace, the tags differed, and "another tag" read
//!   as pid reuse.
//!
//! Fixed (`cxc-mmf/src/identity`): a pid missing from `/proc` is "no such process" only
//! when `kill(pid, 0)` says `ESRCH` (else `/proc` hides it: cannot tell); the pid
//! namespace is read from a pidfd (`PIDFD_GET_PID_NAMESPACE`) where `/proc/self` names
//! nothing; and an identity without a pid namespace is unknown (never judged). All five
//! now hold.
//!
//! Every test re-executes this binary in roles (`cxc_testkit::play_role!`); the parent
//! sides run one at a time (a file-wide lock). All need root (mount namespaces, setuid,
//! pid namespaces) and print SKIPPED otherwise.

mod procs;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use cxc_sync::{
    EpochMode, FailoverWatchdog, HeartbeatOptions, HeartbeatTable, LeaseOptions, OwnerLease,
    Preemption, RwLockOptions, SemaphoreOptions, SharedRwLock, SharedSemaphore,
};
use cxc_testkit::{
    Proc, RoleCommand, arg, child_wait_for_path, fields, is_root, path_arg, play_role, report,
    serial, sleep_forever, try_arg,
};

const HUGE_GRACE: u64 = 1 << 40;
const PATIENCE: Duration = Duration::from_secs(30);
const REPORT_WAIT: Duration = Duration::from_secs(20);
const HB_CAP: usize = 4;
const NOBODY: u32 = 65534;

fn me() -> u32 {
    std::process::id()
}

fn skip_unless_root(test: &str) -> bool {
    if is_root() {
        return false;
    }
    println!("SKIPPED: needs root ({test}: mount namespaces, setuid, pid namespaces)");
    eprintln!("SKIPPED: needs root ({test}: mount namespaces, setuid, pid namespaces)");
    true
}

fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets this process's parent-death signal.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
}

/// Whether `pid` names a live (not zombie) process, asked as root.
fn alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let exists = unsafe { libc::kill(pid as i32, 0) } == 0;
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim().to_owned()))
        .and_then(|r| r.chars().next());
    exists && state.is_some_and(|c| c != 'Z' && c != 'X')
}

/// A scenario directory every uid may use.
fn open_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn lease_opts() -> LeaseOptions {
    LeaseOptions {
        preemption: Preemption::Never,
        epoch: EpochMode::Clock {
            tick: Duration::from_millis(1),
        },
        mode: 0o666,
        ..LeaseOptions::default()
    }
}

fn sem_opts() -> SemaphoreOptions {
    SemaphoreOptions::default().mode(0o666)
}

fn rw_opts() -> RwLockOptions {
    RwLockOptions::default()
        .mode(0o666)
        .grace(Duration::from_secs(600))
}

/// Creates the four files of a scenario in `dir` (the semaphore and the rwlock only if
/// `sem_rw`: they record their creator's pid namespace).
fn create_files(dir: &Path, sem_rw: bool) {
    OwnerLease::<u64>::create_with(dir.join("lease"), 0, &lease_opts()).unwrap();
    let hb = HeartbeatOptions {
        mode: 0o666,
        ..HeartbeatOptions::default()
    };
    HeartbeatTable::create_with(dir.join("hb"), HB_CAP, &hb).unwrap();
    if sem_rw {
        SharedSemaphore::create_with(dir.join("sem"), 1, 1, &sem_opts()).unwrap();
        SharedRwLock::<u64>::create_with(dir.join("rw"), 7, &rw_opts()).unwrap();
    }
}

/// In a judge: restricts this thread's (and its future threads') view of other
/// processes as `view` says, then drops to uid/gid `uid` (root stays root for 0).
///
/// - `none`: the host's `/proc`.
/// - `hidepid=noaccess` / `hidepid=invisible`: a private mount namespace with a fresh
///   `/proc` of our pid namespace mounted with that option.
/// - `mntns=PATH`: enters the mount namespace `PATH` (`/proc/PID/ns/mnt` of a process of
///   another pid namespace), whose `/proc` is that namespace's.
fn restrict_view(view: &str, uid: u32) {
    // SAFETY: unshare/setns/mount take valid NUL-terminated strings and change only this
    // thread's file-system context and mount namespace; the set*id calls change
    // credentials (glibc applies them to every thread).
    unsafe {
        if let Some(opt) = view.strip_prefix("hidepid=") {
            assert_eq!(libc::unshare(libc::CLONE_NEWNS), 0, "unshare(CLONE_NEWNS)");
            let rc = libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            );
            assert_eq!(rc, 0, "make / private: {}", std::io::Error::last_os_error());
            let data = std::ffi::CString::new(format!("hidepid={opt}")).unwrap();
            let rc = libc::mount(
                c"proc".as_ptr(),
                c"/proc".as_ptr(),
                c"proc".as_ptr(),
                0,
                data.as_ptr().cast(),
            );
            assert_eq!(rc, 0, "mount proc: {}", std::io::Error::last_os_error());
        } else if let Some(path) = view.strip_prefix("mntns=") {
            use std::os::fd::AsRawFd;
            let f = std::fs::File::open(path).unwrap();
            // A thread of a multi-threaded process may enter a mount namespace only with
            // a file-system context of its own.
            assert_eq!(libc::unshare(libc::CLONE_FS), 0, "unshare(CLONE_FS)");
            let rc = libc::setns(f.as_raw_fd(), libc::CLONE_NEWNS);
            assert_eq!(rc, 0, "setns(mnt): {}", std::io::Error::last_os_error());
        } else {
            assert_eq!(view, "none", "unknown view {view}");
        }
        if uid != 0 {
            assert_eq!(libc::setgroups(0, std::ptr::null()), 0, "setgroups");
            assert_eq!(libc::setresgid(uid, uid, uid), 0, "setresgid");
            assert_eq!(libc::setresuid(uid, uid, uid), 0, "setresuid");
        }
    }
}

/// What this process's `/proc` shows of `pid`: `stat` readable, or the error.
fn proc_view_of(pid: u32) -> String {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(_) => "readable".into(),
        Err(e) => format!("{:?}", e.kind()).replace(' ', "_"),
    }
}

// ---------------------------------------------------------------------------------------
// The holder of all four primitives, and the judge of all four.
// ---------------------------------------------------------------------------------------

/// Role: holds the lease (for its own pid), the semaphore's only permit, a read hold of
/// the rwlock, and a heartbeat slot with unit 0 in flight (the semaphore and rwlock only
/// if they exist; with `create=1` it makes them first, in its own pid namespace). With
/// `pidns=1` it is pid 1 of a new pid namespace and mounts that namespace's `/proc`
/// first; with `view` it restricts its own view first (see [`restrict_view`]). Reports
/// `HELD`, then sleeps until killed.
fn role_holder() {
    die_with_parent();
    let dir = path_arg("dir");
    if let Some(view) = try_arg("view") {
        restrict_view(view.to_str().unwrap(), 0);
    }
    if arg("pidns") == "1" {
        procs::mount_own_proc();
    }
    if arg("create") == "1" {
        SharedSemaphore::create_with(dir.join("sem"), 1, 1, &sem_opts()).unwrap();
        SharedRwLock::<u64>::create_with(dir.join("rw"), 7, &rw_opts()).unwrap();
    }
    let lease: &'static OwnerLease<u64> =
        Box::leak(Box::new(OwnerLease::open(dir.join("lease")).unwrap()));
    assert!(lease.try_acquire(me(), HUGE_GRACE), "the holder claims");
    let sem: &'static SharedSemaphore =
        Box::leak(Box::new(SharedSemaphore::open(dir.join("sem")).unwrap()));
    let permit = sem.try_acquire().expect("the holder takes the only permit");
    std::mem::forget(permit);
    let rw: &'static SharedRwLock<u64> =
        Box::leak(Box::new(SharedRwLock::open(dir.join("rw")).unwrap()));
    let guard = rw.try_read().expect("the holder reads");
    std::mem::forget(guard);
    let hb: &'static HeartbeatTable = Box::leak(Box::new(
        HeartbeatTable::open(dir.join("hb"), HB_CAP).unwrap(),
    ));
    let reg = hb.join().unwrap();
    reg.mark_in_flight(0).unwrap();
    let slot = reg.slot();
    std::mem::forget(reg);
    report(format!(
        "HELD pid={} slot={slot} pidns={}",
        me(),
        cxc_mmf::identity::Identity::current().pidns
    ));
    sleep_forever();
}

/// Role: restricts its view (`view`, uid `uid`), then judges the holder `holder` (a pid
/// of the parent's namespace) on every primitive, as a process that wants the resource:
/// a lease claim, a semaphore reclaim + permit, an rwlock reclaim + write lock, and a
/// watchdog scan (huge graces: only a verdict of death can give anything).
fn role_judge() {
    die_with_parent();
    let dir = path_arg("dir");
    let uid: u32 = arg("uid").parse().unwrap();
    restrict_view(&arg("view"), uid);
    let holder: u32 = arg("holder").parse().unwrap();
    let id = cxc_mmf::identity::Identity::current();
    let seen = proc_view_of(holder);
    let lease = OwnerLease::<u64>::open(dir.join("lease")).unwrap();
    let lease_took = lease.try_acquire(me(), HUGE_GRACE);
    let (sem_reclaimed, sem_got) = match SharedSemaphore::open(dir.join("sem")) {
        Ok(sem) => {
            let n = sem.reclaim_dead();
            let got = sem.try_acquire().map(std::mem::forget).is_some();
            (n.to_string(), got)
        }
        Err(e) => (
            format!("refused:{}", format!("{e:?}").replace(' ', "")),
            false,
        ),
    };
    let (rw_reclaimed, rw_write) = match SharedRwLock::<u64>::open(dir.join("rw")) {
        Ok(rw) => {
            let n = rw.reclaim_dead();
            let got = rw.try_write().map(std::mem::forget).is_some();
            (n.to_string(), got)
        }
        Err(e) => (
            format!("refused:{}", format!("{e:?}").replace(' ', "")),
            false,
        ),
    };
    let hb = HeartbeatTable::open(dir.join("hb"), HB_CAP).unwrap();
    let wd = FailoverWatchdog::with_grace(&hb, HUGE_GRACE).with_os_check_interval(Duration::ZERO);
    // The OS pass judges a slot whose heartbeat did not move since the previous pass.
    let hb_dead: usize = (0..3).map(|_| wd.scan().dead_slots.len()).sum();
    report(format!(
        "JUDGED seen={seen} my_pidns={} my_boot_known={} lease_took={lease_took} \
         sem_reclaimed={sem_reclaimed} sem_got={sem_got} rw_reclaimed={rw_reclaimed} \
         rw_write={rw_write} hb_dead={hb_dead}",
        id.pidns,
        id.boot != 0
    ));
}

/// The verdicts a judge's report breaks: a live holder must keep everything.
fn broken_promises(line: &str) -> Vec<String> {
    let f = fields(line);
    let mut bad = Vec::new();
    if f["lease_took"] == "true" {
        bad.push("the judge took the live holder's lease".to_owned());
    }
    if f["sem_got"] == "true" || f["sem_reclaimed"].parse::<u32>().is_ok_and(|n| n > 0) {
        bad.push(format!(
            "the judge reclaimed {} permit(s) of the live holder and got one: {}",
            f["sem_reclaimed"], f["sem_got"]
        ));
    }
    if f["rw_write"] == "true" || f["rw_reclaimed"].parse::<u32>().is_ok_and(|n| n > 0) {
        bad.push(format!(
            "the judge reclaimed {} rwlock slot(s) of the live reader, write lock: {}",
            f["rw_reclaimed"], f["rw_write"]
        ));
    }
    if f["hb_dead"] != "0" {
        bad.push("the watchdog reported the live worker dead".to_owned());
    }
    bad
}

/// One round: a root holder (identity form by `fallback`), a judge with `view` as uid
/// nobody. Returns the judge's report.
fn hidepid_round(test: &str, view: &str, fallback: bool) -> String {
    let d = open_dir();
    create_files(d.path(), true);
    let env = if fallback { "1" } else { "0" };
    let mut holder = RoleCommand::new(test, "holder")
        .arg("dir", d.path())
        .arg("pidns", "0")
        .arg("create", "0")
        .env("CXC_IDENTITY_FALLBACK", env)
        .spawn();
    let held = holder.next_report(REPORT_WAIT);
    assert!(held.starts_with("HELD"), "{held}");
    let mut judge = RoleCommand::new(test, "judge")
        .arg("dir", d.path())
        .arg("view", view)
        .arg("uid", NOBODY.to_string())
        .arg("holder", holder.pid().to_string())
        .env("CXC_IDENTITY_FALLBACK", env)
        .spawn();
    let line = judge.next_report(REPORT_WAIT);
    assert!(
        alive(holder.pid()),
        "the holder died during the round: {}",
        holder.stderr()
    );
    println!("view={view} fallback={fallback}: {line}");
    line
}

const HIDEPID_PIDFS: &str = "hidepid_judge_never_condemns_a_live_holder_of_another_uid";

/// owner-lease.md, Identity: "Dead means the whole thread group is gone: the pidfd polls
/// readable, the pid is gone, or it names another process"; shared-semaphore.md: "An
/// unknown identity or an OS that cannot tell means alive (never reclaim on a guess)";
/// heartbeat.md: "an unknown identity is never dead by OS". A judge whose `/proc` hides
/// the holder (uid 65534, `hidepid=noaccess` or `invisible`) must leave a live root
/// holder everything it holds (pidfs identities).
#[test]
fn hidepid_judge_never_condemns_a_live_holder_of_another_uid() {
    play_role!(role_holder, role_judge);
    let _s = serial();
    if skip_unless_root(HIDEPID_PIDFS) {
        return;
    }
    for view in ["none", "hidepid=noaccess", "hidepid=invisible"] {
        let line = hidepid_round(HIDEPID_PIDFS, view, false);
        let bad = broken_promises(&line);
        assert!(bad.is_empty(), "view={view}: {bad:?}: {line}");
    }
}

const HIDEPID_NOACCESS_FALLBACK: &str = "hidepid_noaccess_judge_keeps_fallback_holders";

/// As above on the fallback identity path, where `/proc/PID/stat` is the only witness:
/// under `hidepid=noaccess` it cannot be read (`EACCES`), which must count as "cannot
/// tell", never as dead.
#[test]
fn hidepid_noaccess_judge_keeps_fallback_holders() {
    play_role!(role_holder, role_judge);
    let _s = serial();
    if skip_unless_root(HIDEPID_NOACCESS_FALLBACK) {
        return;
    }
    for view in ["none", "hidepid=noaccess"] {
        let line = hidepid_round(HIDEPID_NOACCESS_FALLBACK, view, true);
        let bad = broken_promises(&line);
        assert!(bad.is_empty(), "view={view}: {bad:?}: {line}");
    }
}

const HIDEPID_INVISIBLE_FALLBACK: &str = "hidepid_invisible_judge_keeps_fallback_holders";

/// owner-lease.md, Identity: "Unknown identities (no pidfs and no `/proc` of our
/// namespace): such a process never shares a slot with another, and its claims can only
/// fail over by heartbeat staleness"; shared-semaphore.md: "An unknown identity or an OS
/// that cannot tell means alive (never reclaim on a guess)". Under `hidepid=invisible`
/// the holder's `/proc/PID` does not exist for the judge while `/proc/self` does.
#[test]
fn hidepid_invisible_judge_keeps_fallback_holders() {
    play_role!(role_holder, role_judge);
    let _s = serial();
    if skip_unless_root(HIDEPID_INVISIBLE_FALLBACK) {
        return;
    }
    let line = hidepid_round(HIDEPID_INVISIBLE_FALLBACK, "hidepid=invisible", true);
    let bad = broken_promises(&line);
    assert!(bad.is_empty(), "{bad:?}: {line}");
}

// ---------------------------------------------------------------------------------------
// 2. A lease holder that execs, judged through hidepid.
// ---------------------------------------------------------------------------------------

/// Role: claims the lease, reports `HELD`, and on marker `exec` execs into `execd`.
fn role_execer() {
    die_with_parent();
    let dir = path_arg("dir");
    let lease = OwnerLease::<u64>::open(dir.join("lease")).unwrap();
    assert!(lease.try_acquire(me(), HUGE_GRACE));
    assert!(lease.write_as_owner(me(), 5));
    report(format!("HELD pid={}", me()));
    child_wait_for_path(&dir.join("exec"), PATIENCE);
    let err = RoleCommand::new(&arg("test"), "execd")
        .arg("dir", &dir)
        .arg("test", arg("test"))
        .into_command()
        .exec();
    panic!("exec: {err}");
}

/// Role: the holder's new image. Reports `EXECD`, waits for marker `reopen` (a daemon's
/// start-up), then opens the lease and reports whether it still owns it.
fn role_execd() {
    die_with_parent();
    let dir = path_arg("dir");
    report(format!("EXECD pid={}", me()));
    child_wait_for_path(&dir.join("reopen"), PATIENCE);
    let lease = OwnerLease::<u64>::open(dir.join("lease")).unwrap();
    report(format!(
        "OWNER owner={} current={:?}",
        lease.am_i_owner(me()),
        lease.current_owner()
    ));
    sleep_forever();
}

/// Role: restricts its view, reports `READY`, and on marker `judge` tries to claim.
fn role_lease_judge() {
    die_with_parent();
    let dir = path_arg("dir");
    restrict_view(&arg("view"), arg("uid").parse().unwrap());
    let holder: u32 = arg("holder").parse().unwrap();
    let lease = OwnerLease::<u64>::open(dir.join("lease")).unwrap();
    report(format!("READY seen={}", proc_view_of(holder)));
    child_wait_for_path(&dir.join("judge"), PATIENCE);
    let took = lease.try_acquire(me(), HUGE_GRACE);
    report(format!("TOOK took={took}"));
}

/// One round: returns (judge took the lease, exec'd holder still owns it).
fn exec_round(test: &str, view: &str) -> (bool, bool) {
    let d = open_dir();
    let dir = d.path();
    create_files(dir, false);
    let mut holder = RoleCommand::new(test, "execer")
        .arg("dir", dir)
        .arg("test", test)
        .spawn();
    let held = holder.next_report(REPORT_WAIT);
    assert!(held.starts_with("HELD"), "{held}");
    let mut judge = RoleCommand::new(test, "lease_judge")
        .arg("dir", dir)
        .arg("view", view)
        .arg("uid", NOBODY.to_string())
        .arg("holder", holder.pid().to_string())
        .spawn();
    let ready = judge.next_report(REPORT_WAIT);
    assert!(ready.starts_with("READY"), "{ready}");
    std::fs::write(dir.join("exec"), "").unwrap();
    let execd = holder.next_report(REPORT_WAIT);
    assert!(execd.starts_with("EXECD"), "{execd}");
    // The new image runs (same pid): the exec is over, the sentinel thread is gone.
    std::thread::sleep(Duration::from_millis(50));
    assert!(alive(holder.pid()));
    std::fs::write(dir.join("judge"), "").unwrap();
    let took_line = judge.next_report(REPORT_WAIT);
    assert!(alive(holder.pid()), "the exec'd holder died");
    std::fs::write(dir.join("reopen"), "").unwrap();
    let owner_line = holder.next_report(REPORT_WAIT);
    println!("view={view}: {ready} | {took_line} | {owner_line}");
    let took = fields(&took_line)["took"] == "true";
    let owner = fields(&owner_line)["owner"] == "true";
    (took, owner)
}

const EXEC_KEPT: &str = "exec_holder_is_kept_by_judges_that_can_or_cannot_read_its_proc";

/// owner-lease.md, The sentinel: "Exec keeps the claims (the same process: same pid and
/// identity). The exec ends the sentinel thread, so a waiter is woken and finds the
/// mark, but the process's threads are not in their exit: it waits on." Judges as uid
/// 65534 with the host's `/proc` and with `hidepid=noaccess` (the task list is
/// unreadable: "cannot tell").
#[test]
fn exec_holder_is_kept_by_judges_that_can_or_cannot_read_its_proc() {
    play_role!(role_execer, role_execd, role_lease_judge);
    let _s = serial();
    if skip_unless_root(EXEC_KEPT) {
        return;
    }
    for view in ["none", "hidepid=noaccess"] {
        let (took, owner) = exec_round(EXEC_KEPT, view);
        assert!(
            !took,
            "view={view}: the live exec'd holder's lease was taken"
        );
        assert!(owner, "view={view}: the live exec'd holder lost its lease");
    }
}

const EXEC_INVISIBLE: &str = "exec_holder_is_kept_by_a_hidepid_invisible_judge";

/// As above with `hidepid=invisible`: `/proc/PID/task` of the holder does not exist for
/// the judge, which owner-lease.md must not read as "every thread `/proc/PID/task` lists
/// is in the kernel's exit" ("Exiting ... so no thread of it can be in a critical section
/// any more"; "What it does not do: ... It does not help for holders ... of unknown
/// identity (their threads cannot be looked at)").
#[test]
fn exec_holder_is_kept_by_a_hidepid_invisible_judge() {
    play_role!(role_execer, role_execd, role_lease_judge);
    let _s = serial();
    if skip_unless_root(EXEC_INVISIBLE) {
        return;
    }
    let (took, owner) = exec_round(EXEC_INVISIBLE, "hidepid=invisible");
    assert!(!took, "the live exec'd holder's lease was taken");
    assert!(owner, "the live exec'd holder lost its lease");
}

// ---------------------------------------------------------------------------------------
// 4. A judge that entered a container's mount namespace only.
// ---------------------------------------------------------------------------------------

/// Role: makes a new pid namespace for its children and runs role `inner` (`holder` or
/// `container`) as its pid 1 (with this process's output), without threads (see
/// `procs::nsroot`).
fn role_pidns_root() {
    die_with_parent();
    // SAFETY: unshare with CLONE_NEWPID only changes the pid namespace of this thread's
    // future children.
    let rc = unsafe { libc::unshare(libc::CLONE_NEWPID) };
    assert_eq!(rc, 0, "unshare(CLONE_NEWPID)");
    let status = RoleCommand::new(&arg("test"), &arg("inner"))
        .arg("dir", path_arg("dir"))
        .arg("pidns", "1")
        .arg("create", "1")
        .into_command()
        .status()
        .expect("run the holder");
    std::process::exit(status.code().unwrap_or(101));
}

/// Role: pid 1 of a new pid namespace with that namespace's `/proc` (a container), which
/// holds nothing: reports `READY` and sleeps until killed.
fn role_container() {
    die_with_parent();
    procs::mount_own_proc();
    report("READY");
    sleep_forever();
}

/// Starts a container (role `container` as pid 1 of a new pid namespace with its own
/// `/proc`; `inner` = `holder` makes it hold everything); returns the helper, the
/// container's pid 1 in our namespace, its first report and the path of its mount
/// namespace.
fn start_container(test: &str, dir: &Path, inner: &str) -> (Proc, u32, String, String) {
    let mut root = RoleCommand::new(test, "pidns_root")
        .arg("dir", dir)
        .arg("test", test)
        .arg("inner", inner)
        .spawn();
    let first = root.next_report(REPORT_WAIT);
    let pid1 = child_of(root.pid()).expect("the container's pid 1");
    let mntns = foreign_mntns(pid1).expect("the container's mount namespace");
    (root, pid1, first, mntns)
}

/// Kills a container started by [`start_container`].
fn stop_container(mut root: Proc, pid1: u32) {
    // SAFETY: kill of a pid we found as our scenario's child.
    unsafe { libc::kill(pid1 as i32, libc::SIGKILL) };
    let _ = root.wait_timeout(REPORT_WAIT);
}

/// The mount namespace of the thread of `pid` that left ours (the holder unshared it in
/// the thread that runs its role, so the process's own `ns/mnt` is still ours).
fn foreign_mntns(pid: u32) -> Option<String> {
    let mine = std::fs::read_link("/proc/self/ns/mnt").ok()?;
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .find_map(|e| {
            let path = e.ok()?.path().join("ns/mnt");
            (std::fs::read_link(&path).ok()? != mine).then(|| path.to_string_lossy().into_owned())
        })
}

/// The pid (in our namespace) of a child of `parent`.
fn child_of(parent: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let ppid: u32 = stat
            .rsplit(')')
            .next()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == parent).then_some(pid)
    })
}

const FOREIGN_PROC: &str = "judge_with_a_foreign_proc_never_condemns_container_holders";

/// shared-semaphore.md, Pid namespaces: "A process of another pid namespace is refused
/// at `open` with `SemaphoreError::ForeignPidNamespace`: its pids (and the holders'
/// pids) would mean different processes on each side, so neither side could judge the
/// other's holders"; "An unknown identity or an OS that cannot tell means alive (never
/// reclaim on a guess)"; shared-rwlock.md: a process of another pid namespace gets
/// `RwLockError::ForeignPidNamespace`. The judge is a host process that entered only the
/// container's mount namespace: its `/proc` is the container's, in which it does not
/// exist, so its own pid namespace reads as unknown (0) while its boot id is known.
#[test]
fn judge_with_a_foreign_proc_never_condemns_container_holders() {
    play_role!(role_holder, role_judge, role_pidns_root);
    let _s = serial();
    if skip_unless_root(FOREIGN_PROC) {
        return;
    }
    let d = open_dir();
    create_files(d.path(), false);
    let (root, holder, held, mntns) = start_container(FOREIGN_PROC, d.path(), "holder");
    assert!(held.starts_with("HELD pid=1 "), "{held}");
    let mut judge = RoleCommand::new(FOREIGN_PROC, "judge")
        .arg("dir", d.path())
        .arg("view", format!("mntns={mntns}"))
        .arg("uid", "0")
        .arg("holder", "1")
        .spawn();
    let line = judge.next_report(REPORT_WAIT);
    println!("{held} | {line}");
    assert!(alive(holder), "the container's holder died");
    let bad = broken_promises(&line);
    stop_container(root, holder);
    assert!(bad.is_empty(), "{bad:?}: {line}");
}

const FOREIGN_HOLDER: &str = "holder_with_a_foreign_proc_is_not_condemned_by_a_plain_judge";

/// The other side of 4: the *holder* is the host process that entered only the
/// container's mount namespace (its `/proc` does not show it: it records pid namespace
/// 0, the boot id and its pidfs inode), on files of the host; the judge is a plain root
/// process of the host. owner-lease.md, Identity: "Dead means the whole thread group is
/// gone: the pidfd polls readable, the pid is gone, or it names another process";
/// shared-semaphore.md: "To judge a slot, the pid is looked up *now* in the form the tag
/// says: no process has it, or the process that has it has another tag (the pid was
/// reused), or its whole thread group has exited (pidfd readable) means dead" and "An
/// unknown identity or an OS that cannot tell means alive (never reclaim on a guess)".
#[test]
fn holder_with_a_foreign_proc_is_not_condemned_by_a_plain_judge() {
    play_role!(role_holder, role_judge, role_pidns_root, role_container);
    let _s = serial();
    if skip_unless_root(FOREIGN_HOLDER) {
        return;
    }
    let d = open_dir();
    create_files(d.path(), true);
    let (root, pid1, ready, mntns) = start_container(FOREIGN_HOLDER, d.path(), "container");
    assert_eq!(ready, "READY");
    let mut holder = RoleCommand::new(FOREIGN_HOLDER, "holder")
        .arg("dir", d.path())
        .arg("view", format!("mntns={mntns}"))
        .arg("pidns", "0")
        .arg("create", "0")
        .spawn();
    let held = holder.next_report(REPORT_WAIT);
    assert!(held.starts_with("HELD"), "{held}");
    let mut judge = RoleCommand::new(FOREIGN_HOLDER, "judge")
        .arg("dir", d.path())
        .arg("view", "none")
        .arg("uid", "0")
        .arg("holder", holder.pid().to_string())
        .spawn();
    let line = judge.next_report(REPORT_WAIT);
    println!("{held} | {line}");
    assert!(alive(holder.pid()), "the holder died");
    let bad = broken_promises(&line);
    stop_container(root, pid1);
    assert!(bad.is_empty(), "{bad:?}: {line}");
}
