//! Reading `/proc` without allocating: paths are formatted on the stack and files read
//! into stack buffers, so the watchdog's scan and a child after `fork` can use them.

use std::ffi::CStr;
use std::mem::MaybeUninit;

use rustix::fs::{Access, Mode, OFlags};
use rustix::io::Errno;

/// What `/proc` says about a pid right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcStatus {
    /// Running, sleeping or stopped, with this start time.
    Live {
        /// Start time in clock ticks since boot.
        start_time: u64,
    },
    /// The main thread has exited (state `Z` or `X`). This is **not** a death
    /// certificate: other threads of the process may still run. Ask
    /// [`liveness`](super::liveness) for a verdict on the whole process.
    Zombie,
    /// No such process.
    Gone,
    /// `/proc` could not tell (not mounted, permission, unparsable).
    Unknown,
}

/// Reads `/proc/<pid>/stat` (allocation-free). A start time is in ticks of the
/// machine's boot clock, whatever time namespace this process is in.
pub fn proc_status(pid: u32) -> ProcStatus {
    match stat_of(pid, None) {
        None => ProcStatus::Unknown,
        Some((ProcStatus::Live { start_time }, _)) => ProcStatus::Live {
            start_time: machine_ticks(start_time, super::cache::facts().boot_off),
        },
        Some((st, _)) => st,
    }
}

/// Parses the text of a `/proc/<pid>/stat` file. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(bytes: &[u8]) -> Option<ProcStatus> {
    parse_stat_full(bytes).map(|(st, _)| st)
}

/// The state letter (field 3) and the task flags (field 9) of a `stat` file's text.
pub(super) fn stat_state_flags(bytes: &[u8]) -> Option<(u8, u64)> {
    let close = bytes.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(bytes.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.bytes().next()?;
    // Fields 4 to 8 come next.
    Some((state, fields.nth(5)?.parse().ok()?))
}

/// The status and, whatever the state letter, the start time (field 22).
fn parse_stat_full(bytes: &[u8]) -> Option<(ProcStatus, u64)> {
    let close = bytes.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(bytes.get(close + 1..)?).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // Field 3 is the state; field 22 the start time, i.e. 19 fields after the state.
    let state = fields.next()?.bytes().next()?;
    let start_time: u64 = fields.nth(18)?.parse().ok()?;
    Some(match state {
        b'Z' | b'X' | b'x' => (ProcStatus::Zombie, start_time),
        _ => (ProcStatus::Live { start_time }, start_time),
    })
}

/// `(status, start time)` of `/proc/<pid>/stat`, or of `/proc/<pid>/task/<tid>/stat`.
/// `None` when `/proc` cannot tell. `Gone` carries start time 0. The start time is as
/// `/proc` shows it to this process: in ticks of its time namespace's boot clock (see
/// [`machine_ticks`]).
pub(super) fn stat_of(pid: u32, tid: Option<u32>) -> Option<(ProcStatus, u64)> {
    stat_of_checked(pid, tid).unwrap_or(None)
}

/// [`stat_of`], telling a passing failure (out of file descriptors or memory:
/// `Err`) from a `/proc` that cannot tell (`Ok(None)`).
pub(super) fn stat_of_checked(
    pid: u32,
    tid: Option<u32>,
) -> Result<Option<(ProcStatus, u64)>, Errno> {
    Ok(match stat_of_inner(pid, tid) {
        Err(e) if super::passing_error(e) => return Err(e),
        Err(_) => None,
        Ok(r) => r,
    })
}

fn stat_of_inner(pid: u32, tid: Option<u32>) -> Result<Option<(ProcStatus, u64)>, Errno> {
    let mut path = PathBuf::new();
    path.push(b"/proc/");
    path.push_u32(pid);
    if let Some(tid) = tid {
        path.push(b"/task/");
        path.push_u32(tid);
    }
    path.push(b"/stat");
    let Some(cpath) = path.as_cstr() else {
        return Ok(None);
    };
    let fd = match rustix::fs::open(cpath, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) | Err(Errno::SRCH) => {
            // Distinguish "no such pid" from "no /proc at all", and from a `/proc` that
            // hides the pid (`hidepid=invisible`, another user's process). A thread id
            // missing under a visible process is a thread that ended.
            let proc_there = rustix::fs::access(c"/proc/self/stat", Access::EXISTS).is_ok();
            return Ok(match tid {
                _ if !proc_there => None,
                Some(_) => Some((ProcStatus::Gone, 0)),
                None => (pid_exists(pid) == Some(false)).then_some((ProcStatus::Gone, 0)),
            });
        }
        Err(e) => return Err(e),
    };
    // A stat line is a few hundred bytes (the command name is at most 64 bytes).
    let mut buf = [0u8; 1024];
    let len = match read_full(&fd, &mut buf) {
        Ok(len) => len,
        Err(Errno::SRCH) => return Ok(Some((ProcStatus::Gone, 0))),
        Err(e) => return Err(e),
    };
    if len == 0 {
        return Ok(Some((ProcStatus::Gone, 0))); // exited between open and read
    }
    Ok(parse_stat_full(&buf[..len]))
}

/// A start time `shown` by `/proc` to a process whose time namespace's boot clock is
/// `boot_off` ns ahead of the machine's, in ticks of the machine's boot clock: what every
/// process, in whatever time namespace, gets for the same process. Exact when the offset
/// is a whole number of ticks (offsets are set in whole seconds by the usual tools).
pub(super) fn machine_ticks(shown: u64, boot_off: i64) -> u64 {
    if boot_off == 0 || shown == 0 {
        return shown;
    }
    let hz = clock_ticks_per_second();
    let off_ticks = (i128::from(boot_off) * i128::from(hz)).div_euclid(1_000_000_000);
    u64::try_from(i128::from(shown) - off_ticks)
        .unwrap_or(0)
        .max(1)
}

/// `sysconf(_SC_CLK_TCK)`: the unit of `/proc`'s start times (100 where unknown).
fn clock_ticks_per_second() -> i64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 { i64::from(hz as i32) } else { 100 }
}

/// This process's time namespace offsets `(monotonic, boottime)` in ns from the
/// machine's clocks, from `/proc/self/timens_offsets` (`(0, 0)` where the kernel has no
/// time namespaces). That file shows the offsets of the namespace this process's
/// children get, which is its own except between an `unshare(CLONE_NEWTIME)` and the
/// next `exec`; then (the two namespace links differ) ours cannot be read and the
/// answer is `(0, 0)`. `Err` for a failure that passes.
pub(super) fn time_offsets() -> Result<(i64, i64), Errno> {
    if let (Ok(a), Ok(b)) = (
        rustix::fs::stat(c"/proc/self/ns/time"),
        rustix::fs::stat(c"/proc/self/ns/time_for_children"),
    ) && a.st_ino != b.st_ino
    {
        return Ok((0, 0));
    }
    let fd = match rustix::fs::open(
        c"/proc/self/timens_offsets",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(e) if super::passing_error(e) => return Err(e),
        Err(_) => return Ok((0, 0)),
    };
    let mut buf = [0u8; 256];
    let len = read_full(&fd, &mut buf)?;
    Ok(parse_time_offsets(&buf[..len]))
}

/// Parses `timens_offsets` text: lines `<clock> <secs> <nanosecs>`, the clock by name
/// (`monotonic`, `boottime`) or number (1, 7). Unparsable lines count as 0.
fn parse_time_offsets(bytes: &[u8]) -> (i64, i64) {
    let (mut mono, mut boot) = (0i64, 0i64);
    let text = std::str::from_utf8(bytes).unwrap_or("");
    for line in text.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(clock), Some(secs), Some(nsecs)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let (Ok(secs), Ok(nsecs)) = (secs.parse::<i64>(), nsecs.parse::<i64>()) else {
            continue;
        };
        let ns = secs.saturating_mul(1_000_000_000).saturating_add(nsecs);
        match clock {
            "monotonic" | "1" => mono = ns,
            "boottime" | "7" => boot = ns,
            _ => {}
        }
    }
    (mono, boot)
}

/// Opens `/proc/<pid>/task` as a directory (`None` if the path cannot be built).
fn open_task_dir(pid: u32) -> Option<Result<rustix::fd::OwnedFd, Errno>> {
    let mut path = PathBuf::new();
    path.push(b"/proc/");
    path.push_u32(pid);
    path.push(b"/task");
    let cpath = path.as_cstr()?;
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Some(rustix::fs::open(cpath, flags, Mode::empty()))
}

/// Whether any thread of process `pid` is still running (not a zombie), by listing
/// `/proc/<pid>/task`. `None` when `/proc` cannot tell.
pub(super) fn any_task_alive(pid: u32) -> Option<bool> {
    let fd = match open_task_dir(pid)? {
        Ok(fd) => fd,
        // No such process, unless `/proc` hides it (`hidepid`): then it cannot tell.
        Err(Errno::NOENT) | Err(Errno::SRCH) => {
            return (pid_exists(pid) == Some(false)).then_some(false);
        }
        Err(_) => return None,
    };
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    let mut dir = rustix::fs::RawDir::new(&fd, &mut buf);
    while let Some(entry) = dir.next() {
        let Ok(entry) = entry else { return None };
        let Some(tid) = parse_u32(entry.file_name().to_bytes()) else {
            continue; // "." and ".."
        };
        match stat_of(pid, Some(tid)) {
            Some((ProcStatus::Live { .. }, _)) => return Some(true),
            Some(_) => {}
            None => return None,
        }
    }
    Some(false)
}

/// Most threads [`all_tasks_flagged`] follows; a process with more cannot be told
/// (`None`), and callers then wait for its death.
const MAX_FLAGGED_TASKS: usize = 512;

/// Rounds [`all_tasks_flagged`] takes, at most, before it answers "not known".
const FLAGGED_ROUNDS: usize = 6;

/// The thread ids `/proc/<pid>/task` lists.
type Listing = ([u32; MAX_FLAGGED_TASKS], usize);

/// Lists the threads of the task directory `dirfd` from its start: `None` when `/proc`
/// cannot tell or for more than [`MAX_FLAGGED_TASKS`] threads.
fn list_tasks(dirfd: &rustix::fd::OwnedFd) -> Option<Listing> {
    rustix::fs::seek(dirfd, rustix::fs::SeekFrom::Start(0)).ok()?;
    let mut tids = [0u32; MAX_FLAGGED_TASKS];
    let mut n = 0;
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    let mut dir = rustix::fs::RawDir::new(dirfd, &mut buf);
    while let Some(entry) = dir.next() {
        let Ok(entry) = entry else { return None };
        let Some(tid) = parse_u32(entry.file_name().to_bytes()) else {
            continue; // "." and ".."
        };
        *tids.get_mut(n)? = tid;
        n += 1;
    }
    Some((tids, n))
}

/// The `stat` files of the threads [`all_tasks_flagged`] has read, kept open so that a
/// later round reads each again with one `pread`. An open `stat` follows the thread id,
/// not the thread: after an exec's tid exchange it shows whatever thread the id names.
struct TaskStats {
    tids: [u32; MAX_FLAGGED_TASKS],
    fds: [Option<rustix::fd::OwnedFd>; MAX_FLAGGED_TASKS],
    n: usize,
}

impl TaskStats {
    fn new() -> Self {
        TaskStats {
            tids: [0; MAX_FLAGGED_TASKS],
            fds: [const { None }; MAX_FLAGGED_TASKS],
            n: 0,
        }
    }

    /// Thread `tid`'s state letter and task flags (`dirfd`: its process's task
    /// directory): `Some(None)` if the thread is gone, `None` when `/proc` cannot tell.
    fn read(&mut self, dirfd: &rustix::fd::OwnedFd, tid: u32) -> Option<Option<(u8, u64)>> {
        let i = match self.tids[..self.n].iter().position(|&t| t == tid) {
            Some(i) => i,
            None => {
                let mut rel = PathBuf::new();
                rel.push_u32(tid);
                rel.push(b"/stat");
                let crel = rel.as_cstr()?;
                let fd = match rustix::fs::openat(
                    dirfd,
                    crel,
                    OFlags::RDONLY | OFlags::CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => fd,
                    Err(Errno::NOENT) | Err(Errno::SRCH) => return Some(None),
                    Err(_) => return None,
                };
                let i = self.n;
                *self.tids.get_mut(i)? = tid;
                self.fds[i] = Some(fd);
                self.n += 1;
                i
            }
        };
        let fd = self.fds[i].as_ref()?;
        let mut stat = [0u8; 1024];
        let mut len = 0;
        while len < stat.len() {
            match rustix::io::pread(fd, &mut stat[len..], len as u64) {
                Ok(0) => break,
                Ok(k) => len += k,
                Err(Errno::INTR) => {}
                Err(Errno::SRCH) => return Some(None),
                Err(_) => return None,
            }
        }
        if len == 0 {
            return Some(None);
        }
        stat_state_flags(&stat[..len]).map(Some)
    }
}

/// Whether every thread of process `pid` has `flag` in its task flags (field 9 of its
/// `stat`), judged from listings of `/proc/<pid>/task` that no thread escaped. A round
/// lists the threads, reads each one's flags (any without `flag`: `Some(false)`), and
/// lists them again: a thread new in the second listing (started after the first by a
/// thread that has since taken `flag` or ended) gives `Some(false)`. A thread that
/// vanished before it was ever read with `flag` is not taken for exiting: it may have
/// handed its tid to a thread that `exec`s (the exec's tid exchange), so its tid can now
/// name a thread that runs on (for the same reason a zombie under a tid other than the
/// process's gives `Some(false)`); one read with `flag` (not a zombie) was in its exit
/// and may vanish. The next round reads the second listing's threads again. A listing is not a snapshot (the kernel walks the thread list while threads
/// come and go), so one can miss a thread that was just started while the thread that
/// started it ends: the answer is `Some(true)` only after two rounds in a row in which
/// none vanished, and `Some(false)` ("not known now", the caller looks again later)
/// after [`FLAGGED_ROUNDS`] rounds. `Some(true)` also for a process whose task directory is
/// gone. `None` when `/proc` cannot tell, or for more than [`MAX_FLAGGED_TASKS`]
/// threads. Allocation-free.
pub(super) fn all_tasks_flagged(pid: u32, flag: u64) -> Option<bool> {
    let gone = || {
        // Gone, unless there is no `/proc` at all.
        rustix::fs::access(c"/proc/self/stat", Access::EXISTS)
            .is_ok()
            .then_some(true)
    };
    let dirfd = match open_task_dir(pid)? {
        Ok(fd) => fd,
        // Gone, unless `/proc` hides the process (`hidepid`, another user's): then the
        // task list cannot tell, however many threads run.
        Err(Errno::NOENT) | Err(Errno::SRCH) if pid_exists(pid) == Some(false) => return gone(),
        Err(_) => return None,
    };
    let (mut tids, mut n) = list_tasks(&dirfd)?;
    let mut stats = TaskStats::new();
    // Threads other than the main one read with `flag` (not zombies): such a thread is
    // in its exit for good, so its vanishing later is that exit ending, not a tid handed on.
    let mut exiting = [0u32; MAX_FLAGGED_TASKS];
    let mut e = 0;
    let mut clean = 0;
    for _ in 0..FLAGGED_ROUNDS {
        let mut vanished = false;
        for &tid in &tids[..n] {
            if exiting[..e].contains(&tid) {
                // In its exit for good: an exec hands on only the tids of the thread that
                // calls it (never in its exit) and of the main thread (always read again).
                continue;
            }
            match stats.read(&dirfd, tid)? {
                // Only the main thread waits as a zombie for the rest of the group; a
                // zombie under another tid is the old main thread behind the tid that an
                // exec'ing thread gave up (or a traced thread): the thread it named runs on.
                Some((b'Z', _)) if tid != pid => return Some(false),
                Some((_, f)) if f & flag != 0 => {
                    if tid != pid && !exiting[..e].contains(&tid) {
                        *exiting.get_mut(e)? = tid;
                        e += 1;
                    }
                }
                Some(_) => return Some(false),
                None => vanished = true,
            }
        }
        let (next, m) = list_tasks(&dirfd)?;
        if m == 0 {
            // Every thread released: the process is gone (or going).
            return gone();
        }
        if next[..m].iter().any(|t| !tids[..n].contains(t)) {
            return Some(false);
        }
        clean = if vanished { 0 } else { clean + 1 };
        if clean == 2 {
            return Some(true);
        }
        (tids, n) = (next, m);
    }
    Some(false)
}

/// Whether `/proc` belongs to our pid namespace: `/proc/self` must name our own pid.
/// A `/proc` mounted for another namespace would answer for other processes.
pub(super) fn proc_is_ours(pid: u32) -> bool {
    let mut buf = [0u8; 16];
    match rustix::fs::readlinkat_raw(rustix::fs::CWD, c"/proc/self", &mut buf) {
        Ok(n) => buf.get(..n).and_then(parse_u32) == Some(pid),
        Err(_) => false,
    }
}

/// Whether a process with `pid` (in our pid namespace) exists, zombie included, by
/// `kill(pid, 0)`: `Some(false)` only for `ESRCH`. Unlike `/proc`, the answer does not
/// depend on `/proc`'s mount options (`hidepid`) or on the pid's owner (`EPERM` means it
/// exists).
pub(super) fn pid_exists(pid: u32) -> Option<bool> {
    let pid = rustix::process::Pid::from_raw(i32::try_from(pid).ok()?)?;
    match rustix::process::test_kill_process(pid) {
        Ok(()) | Err(Errno::PERM) => Some(true),
        Err(Errno::SRCH) => Some(false),
        Err(_) => None,
    }
}

/// Our pid namespace's id (the nsfs inode): from `/proc/self/ns/pid`, or, where `/proc`
/// is not our namespace's (a container's `/proc` seen from the host's namespace, where
/// `/proc/self` names nothing), from a pidfd for this process (`PIDFD_GET_PID_NAMESPACE`,
/// Linux 6.11+). 0 if unknown.
pub(super) fn self_pidns(pid: u32) -> u64 {
    if let Ok(s) = rustix::fs::stat(c"/proc/self/ns/pid") {
        return s.st_ino;
    }
    pidns_by_pidfd(pid).unwrap_or(0)
}

/// `PIDFD_GET_PID_NAMESPACE`: `_IO(PIDFS_IOCTL_MAGIC = 0xFF, 5)` (`<linux/pidfd.h>`).
#[cfg(target_os = "linux")]
const PIDFD_GET_PID_NAMESPACE: libc::c_ulong = 0xFF05;

#[cfg(target_os = "linux")]
fn pidns_by_pidfd(pid: u32) -> Option<u64> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let pidfd = super::pidfd::open(pid).ok()?;
    // SAFETY: `pidfd` is an open pidfd; this ioctl takes no argument and returns a new
    // file descriptor (or -1), which we then own. Kernels without it answer -1 (ENOTTY /
    // EINVAL) and nothing happens.
    let raw = unsafe { libc::ioctl(pidfd.as_raw_fd(), PIDFD_GET_PID_NAMESPACE as _) };
    if raw < 0 {
        return None;
    }
    // SAFETY: `raw` is a new file descriptor that nothing else owns.
    let ns = unsafe { OwnedFd::from_raw_fd(raw) };
    rustix::fs::fstat(&ns)
        .ok()
        .map(|s| s.st_ino)
        .filter(|&i| i != 0)
}

#[cfg(not(target_os = "linux"))]
fn pidns_by_pidfd(_pid: u32) -> Option<u64> {
    None
}

/// Reads `fd` into `buf` until end of file or `buf` is full (retrying on EINTR); the
/// number of bytes read.
fn read_full(fd: &rustix::fd::OwnedFd, buf: &mut [u8]) -> Result<usize, Errno> {
    let mut len = 0;
    while len < buf.len() {
        match rustix::io::read(fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(len)
}

/// A 64-bit hash (FNV-1a) of `/proc/sys/kernel/random/boot_id`; never 0 when read, 0 if
/// it cannot be read.
pub(super) fn boot_hash() -> u64 {
    let Ok(fd) = rustix::fs::open(
        c"/proc/sys/kernel/random/boot_id",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    let mut buf = [0u8; 64];
    let Ok(len) = read_full(&fd, &mut buf) else {
        return 0;
    };
    let text = buf[..len].trim_ascii();
    if text.is_empty() {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in text {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h.max(1)
}

fn parse_u32(s: &[u8]) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = s.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
    u32::try_from(n).ok()
}

/// A NUL-terminated path built on the stack.
struct PathBuf {
    buf: [u8; 64],
    len: usize,
    overflow: bool,
}

impl PathBuf {
    fn new() -> Self {
        PathBuf {
            buf: [0; 64],
            len: 0,
            overflow: false,
        }
    }

    fn push(&mut self, s: &[u8]) {
        // Keep one byte for the terminating NUL.
        let end = self.len + s.len();
        if end >= self.buf.len() {
            self.overflow = true;
            return;
        }
        match self.buf.get_mut(self.len..end) {
            Some(dst) => {
                dst.copy_from_slice(s);
                self.len += s.len();
            }
            _ => self.overflow = true,
        }
    }

    fn push_u32(&mut self, mut n: u32) {
        let mut digits = [0u8; 10];
        let mut d = digits.len();
        loop {
            d -= 1;
            digits[d] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[d..]);
    }

    fn as_cstr(&mut self) -> Option<&CStr> {
        if self.overflow {
            return None;
        }
        self.buf[self.len] = 0;
        CStr::from_bytes_with_nul(&self.buf[..=self.len]).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let line =
            b"1234 (a b) c)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(
            parse_stat(line),
            Some(ProcStatus::Live { start_time: 987654 })
        );
        let zombie = b"1 (x) Z 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0";
        assert_eq!(parse_stat(zombie), Some(ProcStatus::Zombie));
        assert_eq!(parse_stat_full(zombie), Some((ProcStatus::Zombie, 5)));
        assert_eq!(parse_stat(b"garbage"), None);
        assert_eq!(parse_stat(b"1 (x) S 1"), None);
        // State (field 3) and flags (field 9): 4194560 = 0x400100, 0x404 has PF_EXITING.
        assert_eq!(stat_state_flags(line), Some((b'S', 4194560)));
        let exiting = b"7 (w (1)) R 1 7 7 0 -1 1028 0 0";
        assert_eq!(stat_state_flags(exiting), Some((b'R', 0x404)));
        assert_eq!(stat_state_flags(zombie), Some((b'Z', 0)));
        assert_eq!(stat_state_flags(b"1 (x) S 1 1"), None);
    }

    #[test]
    fn this_running_process_is_not_all_exiting() {
        let me = std::process::id();
        assert_eq!(all_tasks_flagged(me, PF_EXITING_FLAG), Some(false));
    }

    /// `PF_EXITING`, as `identity::threads_stopped` passes it.
    const PF_EXITING_FLAG: u64 = 0x4;

    #[test]
    fn paths_and_numbers() {
        let mut p = PathBuf::new();
        p.push(b"/proc/");
        p.push_u32(u32::MAX);
        p.push(b"/stat");
        assert_eq!(p.as_cstr().unwrap().to_bytes(), b"/proc/4294967295/stat");
        let mut long = PathBuf::new();
        long.push(&[b'a'; 64]);
        assert!(long.as_cstr().is_none());
        assert_eq!(parse_u32(b"4294967295"), Some(u32::MAX));
        assert_eq!(parse_u32(b"4294967296"), None);
        assert_eq!(parse_u32(b".."), None);
    }

    #[test]
    fn self_is_live_and_has_tasks() {
        let me = std::process::id();
        assert!(matches!(proc_status(me), ProcStatus::Live { .. }));
        assert_eq!(any_task_alive(me), Some(true));
        assert!(proc_is_ours(me));
        assert_ne!(self_pidns(std::process::id()), 0);
        assert_ne!(boot_hash(), 0);
        assert_eq!(
            parse_time_offsets(b"monotonic        3600         0\nboottime   -5  500\n"),
            (3_600_000_000_000, -4_999_999_500)
        );
        assert_eq!(
            parse_time_offsets(b"1 2 0\n7 0 10\njunk\n"),
            (2_000_000_000, 10)
        );
        assert_eq!(machine_ticks(500, 0), 500);
        let hz = clock_ticks_per_second() as u64;
        assert_eq!(machine_ticks(10 * hz + 7, 10_000_000_000), 7);
        assert_eq!(machine_ticks(7, -10_000_000_000), 10 * hz + 7);
        assert_eq!(boot_hash(), boot_hash());
    }
}
