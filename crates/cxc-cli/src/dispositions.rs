//! The signal dispositions cxc inherits from its caller, and the ones it changes in itself
//! (docs/cli.md, "Signals the caller set").
//!
//! A command run by cxc must start with the dispositions and mask it would have had under
//! flock(1). cxc only ever *catches* signals it found at their default (a caught signal
//! reverts to the default at exec, so the keeper and the command get the caller's
//! disposition back), and leaves a signal the caller ignored (`SIG_IGN`, which survives
//! exec) ignored. It blocks none. (SIGPIPE is the exception: the Rust runtime ignores it
//! before `main` and resets it to the default in every child it starts; see docs/cli.md.)
#![allow(unsafe_code)]

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Whether `sig` is ignored (`SIG_IGN`) in this process: before cxc installs anything for
/// it, that is what its caller left it (`nohup` ignores SIGHUP; a non-interactive shell
/// ignores SIGINT and SIGQUIT in a background job). `false` if it cannot be read.
pub(crate) fn is_ignored(sig: i32) -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    // SAFETY: sigaction(2) with a null new action changes nothing: it only writes the
    // current disposition of `sig` into `old`, a properly aligned, writable `sigaction`
    // owned by this frame. An invalid `sig` makes it fail with EINVAL, writing nothing.
    let rc = unsafe { libc::sigaction(sig, std::ptr::null(), old.as_mut_ptr()) };
    // SAFETY: `old` was zero-initialised, a valid value of this plain C struct (integers,
    // a handler address, a sigset and flags), and sigaction(2) wrote only such values.
    let old = unsafe { old.assume_init() };
    rc == 0 && old.sa_sigaction == libc::SIG_IGN
}

/// Keeps a file size limit (`ulimit -f`, RLIMIT_FSIZE) from killing cxc: SIGXFSZ, whose
/// default ends the process, is caught (by a handler that does nothing), so a write or
/// `fallocate` past the limit fails with EFBIG instead, reported as any other error of
/// the file (exit 2, one line). Caught rather than ignored: a caught signal reverts to
/// its default at exec, so the keeper and the command start with SIGXFSZ at its default,
/// as the caller left it. A caller that ignores it already keeps cxc alive, and the
/// command inherits that, as under flock(1).
pub(crate) fn survive_file_size_limit() {
    let sig = signal_hook::consts::SIGXFSZ;
    if !is_ignored(sig) {
        let _ = signal_hook::flag::register(sig, Arc::new(AtomicBool::new(false)));
    }
}
