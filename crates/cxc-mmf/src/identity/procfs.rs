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

/// Reads `/proc/<pid>/stat` (allocation-free).
pub fn proc_status(pid: u32) -> ProcStatus {
    stat_of(pid, None).map_or(ProcStatus::Unknown, |s| s.0)
}

/// Parses the text of a `/proc/<pid>/stat` file. The command name (field 2) may contain
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(bytes: &[u8]) -> Option<ProcStatus> {
    parse_stat_full(bytes).map(|(st, _)| st)
}

/// The task flags (field 9) of a `stat` file's text.
pub(super) fn stat_flags(bytes: &[u8]) -> Option<u64> {
    let close = bytes.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(bytes.get(close + 1..)?).ok()?;
    // Fields 3 (state) to 8 come first.
    rest.split_ascii_whitespace().nth(6)?.parse().ok()
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
/// `None` when `/proc` cannot tell. `Gone` carries start time 0.
pub(super) fn stat_of(pid: u32, tid: Option<u32>) -> Option<(ProcStatus, u64)> {
    let mut path = PathBuf::new();
    path.push(b"/proc/");
    path.push_u32(pid);
    if let Some(tid) = tid {
        path.push(b"/task/");
        path.push_u32(tid);
    }
    path.push(b"/stat");
    let cpath = path.as_cstr()?;
    let fd = match rustix::fs::open(cpath, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) | Err(Errno::SRCH) => {
            // Distinguish "no such pid" from "no /proc at all".
            return if rustix::fs::access(c"/proc/self/stat", Access::EXISTS).is_ok() {
                Some((ProcStatus::Gone, 0))
            } else {
                None
            };
        }
        Err(_) => return None,
    };
    // A stat line is a few hundred bytes (the command name is at most 64 bytes).
    let mut buf = [0u8; 1024];
    let len = match read_full(&fd, &mut buf) {
        Ok(len) => len,
        Err(Errno::SRCH) => return Some((ProcStatus::Gone, 0)),
        Err(_) => return None,
    };
    if len == 0 {
        return Some((ProcStatus::Gone, 0)); // exited between open and read
    }
    parse_stat_full(&buf[..len])
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
        Err(Errno::NOENT) | Err(Errno::SRCH) => return Some(false),
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

/// Whether every thread of process `pid` has `flag` in its task flags (field 9 of its
/// `stat`), judged from a listing of `/proc/<pid>/task` that no thread escaped: every
/// listed thread's `stat` shows `flag`, and a second listing, taken after those reads,
/// names no thread the first did not. A thread that vanished between the listing and its
/// read gives `Some(false)` (it may have started a successor and ended normally, or
/// handed its tid to a thread that `exec`s: neither is an exit of the process), and so
/// does a thread new in the second listing; the caller looks again later. `Some(true)`
/// also for a process whose task directory is gone. `None` when `/proc` cannot tell, or
/// for more than [`MAX_FLAGGED_TASKS`] threads. Allocation-free.
pub(super) fn all_tasks_flagged(pid: u32, flag: u64) -> Option<bool> {
    let dirfd = match open_task_dir(pid)? {
        Ok(fd) => fd,
        Err(Errno::NOENT) | Err(Errno::SRCH) => {
            // Gone, unless there is no `/proc` at all.
            return rustix::fs::access(c"/proc/self/stat", Access::EXISTS)
                .is_ok()
                .then_some(true);
        }
        Err(_) => return None,
    };
    let mut listed = [0u32; MAX_FLAGGED_TASKS];
    let mut n = 0;
    let mut buf = [MaybeUninit::<u8>::uninit(); 2048];
    let mut dir = rustix::fs::RawDir::new(&dirfd, &mut buf);
    while let Some(entry) = dir.next() {
        let Ok(entry) = entry else { return None };
        let Some(tid) = parse_u32(entry.file_name().to_bytes()) else {
            continue; // "." and ".."
        };
        *listed.get_mut(n)? = tid;
        n += 1;
        let mut rel = PathBuf::new();
        rel.push_u32(tid);
        rel.push(b"/stat");
        let crel = rel.as_cstr()?;
        let fd = match rustix::fs::openat(
            &dirfd,
            crel,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            // Gone since the listing: not known to have exited with the process.
            Err(Errno::NOENT) | Err(Errno::SRCH) => return Some(false),
            Err(_) => return None,
        };
        let mut stat = [0u8; 1024];
        let len = match read_full(&fd, &mut stat) {
            Ok(0) | Err(Errno::SRCH) => return Some(false),
            Ok(len) => len,
            Err(_) => return None,
        };
        match stat_flags(&stat[..len]) {
            Some(f) if f & flag != 0 => {}
            Some(_) => return Some(false),
            None => return None,
        }
    }
    // A thread started after the listing by one that has since taken `flag` (or ended)
    // is in a second listing; it would otherwise go unseen.
    let again = match open_task_dir(pid)? {
        Ok(fd) => fd,
        Err(Errno::NOENT) | Err(Errno::SRCH) => return Some(true),
        Err(_) => return None,
    };
    let mut dir = rustix::fs::RawDir::new(&again, &mut buf);
    while let Some(entry) = dir.next() {
        let Ok(entry) = entry else { return None };
        let Some(tid) = parse_u32(entry.file_name().to_bytes()) else {
            continue;
        };
        if !listed[..n].contains(&tid) {
            return Some(false);
        }
    }
    Some(true)
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

/// The inode of `/proc/self/ns/pid`: our pid namespace; 0 if unknown.
pub(super) fn self_pidns() -> u64 {
    rustix::fs::stat(c"/proc/self/ns/pid").map_or(0, |s| s.st_ino)
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
    }

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
        assert_ne!(self_pidns(), 0);
        assert_ne!(boot_hash(), 0);
        assert_eq!(boot_hash(), boot_hash());
    }
}
