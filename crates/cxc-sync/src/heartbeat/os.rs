//! An allocation-free variant of [`crate::liveness::check`] for the watchdog's scan:
//! the `/proc/<pid>/stat` path is formatted on the stack and read into a stack buffer, so
//! `scan` allocates nothing even when it asks the OS about a busy slot.

use std::ffi::CStr;

use crate::liveness::{Liveness, ProcStatus};

/// Whether the process `pid` that started at `start_time` is still the same process.
/// Same verdicts as [`crate::liveness::check`].
pub(crate) fn check(pid: u32, start_time: u64) -> Liveness {
    if pid == 0 || start_time == 0 {
        return Liveness::Unknown;
    }
    match proc_status(pid) {
        ProcStatus::Live { start_time: s } if s == start_time => Liveness::Alive,
        ProcStatus::Live { .. } | ProcStatus::Zombie | ProcStatus::Gone => Liveness::Dead,
        ProcStatus::Unknown => Liveness::Unknown,
    }
}

fn proc_status(pid: u32) -> ProcStatus {
    use rustix::fs::{Access, Mode, OFlags};
    let mut path = [0u8; 32];
    let Some(cpath) = stat_path(pid, &mut path) else {
        return ProcStatus::Unknown;
    };
    let fd = match rustix::fs::open(cpath, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => {
            // Distinguish "no such pid" from "no /proc at all".
            return if rustix::fs::access(c"/proc/self/stat", Access::EXISTS).is_ok() {
                ProcStatus::Gone
            } else {
                ProcStatus::Unknown
            };
        }
        Err(_) => return ProcStatus::Unknown,
    };
    // A stat line is a few hundred bytes (the command name is at most 64 bytes).
    let mut buf = [0u8; 1024];
    let mut len = 0;
    while len < buf.len() {
        match rustix::io::read(&fd, &mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::SRCH) => return ProcStatus::Gone,
            Err(_) => return ProcStatus::Unknown,
        }
    }
    if len == 0 {
        return ProcStatus::Gone; // the process exited between open and read
    }
    cxc_mmf::identity::parse_stat(&buf[..len]).unwrap_or(ProcStatus::Unknown)
}

/// Writes `/proc/<pid>/stat\0` into `buf`.
fn stat_path(pid: u32, buf: &mut [u8; 32]) -> Option<&CStr> {
    let mut digits = [0u8; 10];
    let mut n = pid;
    let mut d = digits.len();
    loop {
        d -= 1;
        digits[d] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    let parts: [&[u8]; 3] = [b"/proc/", &digits[d..], b"/stat\0"];
    let mut at = 0;
    for p in parts {
        buf.get_mut(at..at + p.len())?.copy_from_slice(p);
        at += p.len();
    }
    CStr::from_bytes_with_nul(&buf[..at]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_liveness_check() {
        let me = crate::liveness::current();
        assert_eq!(check(me.pid, me.start_time), Liveness::Alive);
        assert_eq!(check(me.pid, me.start_time + 1), Liveness::Dead);
        assert_eq!(check(me.pid, 0), Liveness::Unknown);
        assert_eq!(check(4_100_000, 5), Liveness::Dead);
        let mut buf = [0u8; 32];
        assert_eq!(
            stat_path(u32::MAX, &mut buf).unwrap().to_bytes(),
            b"/proc/4294967295/stat"
        );
        assert_eq!(stat_path(7, &mut buf).unwrap().to_bytes(), b"/proc/7/stat");
    }
}
