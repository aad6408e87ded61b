#![cfg(not(cxc_loom))]
#![allow(unsafe_code)]
//! attack33: `SeqLock` / `SharedCell` promises (docs/seqlock.md, docs/shared-cell.md) not
//! attacked before, with real processes.
//!
//! 1. A writer frozen (ptrace: a fresh fork per point, stopped by a breakpoint) **before
//!    every instruction** of a `store`, of an `update`, and of its first store (reserving
//!    a free slot, or reclaiming the slot of a dead process that held the update claim);
//!    there it is SIGKILLed, or left frozen while another process stores or updates and
//!    then resumed. Checked at each point: what loads show (C1 whole values, S3 nothing
//!    of the frozen writer before its CAS), that the other process's write does not wait
//!    (C3/S4), what the resumed writer does (a blind store is never lost, an update
//!    publishes only over the value it read: S5 exactly-once), `Written::abandoned`
//!    exact, and that a slot leaks exactly when the kill fell between `BUSY` and `VALID`;
//!    a reader process checks C1 and C2 (never goes back) throughout.
//! 2. A full table (32 slots) whose 32nd slot belongs to a writer whose main thread exited
//!    (before or after its first store; pidfs and fallback identities), to a stopped
//!    writer, or to a killed but unreaped one: a newcomer is refused while it lives (a
//!    live writer's slot is never reclaimed) and gets the slot at once when it is dead.
//! 3. An update claim held by a process whose main thread exited (inside the closure):
//!    not "proven dead", so superseded only after the stall timeout (`Stalled`, never
//!    `Died`); killed, it is replaced at once (`Died`).
//! 4. Pid reuse (root, fresh pid namespace): an updater killed holding the claim, its pid
//!    handed to a fork descendant that has a copy of its handle: the next update (stall
//!    timeout 10 s) takes the claim at once as `Died`; with the table then full, the dead
//!    holder's slot is reclaimed and the heir's (same pid) is not; pidfs and fallback.
//! 5. A process that `exec`s itself and stores after every exec, dropping its handle
//!    first (without the drop, the slot of each previous image stays reserved while the
//!    process lives: found here, now in the Pitfalls).
//! 6. Every payload size the docs allow (1..=48 bytes, alignment 1..=8) round-trips on the
//!    heap, in a file and through `inspect`; 49 bytes and alignment 16 are refused; a
//!    cell of another `T` of the same size is refused; odd-sized payloads stored by
//!    processes SIGSTOPped/SIGKILLed at random are never torn.
//! 7. `update` closures that re-enter (`update` / `write` through the same handle, and
//!    through another handle of the same file).
//! 8. An updater next to two processes updating in tight loops (no fairness promise;
//!    measured) and a reader next to writers storing flat out (reads complete).
//! 9. Hostile files: slot words, claim word and published word patched to garbage in a
//!    live file (typed errors or progress, no panic, no hang); a file truncated to 0 bytes
//!    under a mapping (the documented SIGBUS). Truncated inside its first page, a mapped
//!    reader's load returned `[0; 6]` without a fault (the rest of the page reads as
//!    zeros): the Pitfalls now say so; no test keeps it.

mod procs;

use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cxc_sync::{Abandoned, SharedCell, WriteError, Written};
use cxc_testkit::{
    Proc, RoleCommand, arg, intact, num, path_arg, play_role, report, sealed, serial,
};

const REPORT_WAIT: Duration = Duration::from_secs(30);
const CHILD_DEADLINE: Duration = Duration::from_secs(55);

/// Header length; the state block follows (docs/shared-cell.md, "Layout").
const HDR: usize = 128;
/// Offsets in the file.
const PUB_WORD: usize = HDR;
const CLAIM_WORD: usize = HDR + 64;
const SLOTS_AT: usize = HDR + 256;
const FILE_LEN: usize = 9216;

fn me() -> u32 {
    std::process::id()
}

/// A read-only shared mapping of a whole cell file, to watch its words from outside the
/// library.
struct Watch {
    p: *const u8,
}

impl Watch {
    fn new(path: &Path) -> Watch {
        let f = std::fs::File::open(path).unwrap();
        assert_eq!(f.metadata().unwrap().len() as usize, FILE_LEN);
        // SAFETY: a fresh read-only shared mapping of the whole file (its length checked
        // above); never unmapped, read only through atomics.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                FILE_LEN,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Watch { p: p.cast() }
    }

    fn word(&self, off: usize) -> u64 {
        assert!(off.is_multiple_of(8) && off + 8 <= FILE_LEN);
        // SAFETY: in bounds (checked), 8-aligned (the mapping is page aligned), and the
        // library only accesses these bytes atomically.
        unsafe { (*self.p.add(off).cast::<AtomicU64>()).load(Ordering::SeqCst) }
    }

    /// A hash of the whole state block: changes whenever any shared word does.
    fn state_hash(&self) -> u64 {
        (HDR..FILE_LEN)
            .step_by(8)
            .fold(0xcbf2_9ce4_8422_2325, |h, o| {
                (h ^ self.word(o)).wrapping_mul(0x100_0000_01b3)
            })
    }

    fn claim_held(&self) -> bool {
        self.word(CLAIM_WORD) & 0x7F != 0
    }
}

// ---------------------------------------------------------------------------------------
// ptrace helpers (x86-64 and aarch64 register access through PTRACE_GETREGSET).
// ---------------------------------------------------------------------------------------

mod pt {
    pub(crate) fn traceme() {
        // SAFETY: PTRACE_TRACEME takes no pointers.
        let r = unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) };
        assert_eq!(r, 0);
    }

    /// Stops this process (a signal-delivery stop its tracer sees).
    pub(crate) fn stop_self() {
        // SAFETY: sends SIGSTOP to this process only.
        unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
    }

    /// Waits for `pid`'s next state change: `Ok(stop signal)` or `Err(raw status)`.
    pub(crate) fn wait(pid: i32) -> Result<i32, i32> {
        let mut st = 0;
        // SAFETY: waits for our own child; `st` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut st, libc::__WALL) };
        assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
        if libc::WIFSTOPPED(st) {
            Ok(libc::WSTOPSIG(st))
        } else {
            Err(st)
        }
    }

    fn req(r: libc::c_uint, pid: i32, addr: usize, data: usize) -> libc::c_long {
        // SAFETY: the requests used here (SINGLESTEP, CONT, PEEK/POKETEXT, GET/SETREGSET
        // with a valid iovec) act on our stopped tracee only.
        unsafe { libc::ptrace(r, pid, addr, data) }
    }

    /// Starts one single step (wait for its stop with [`wait`]).
    pub(crate) fn start_step(pid: i32) {
        assert_eq!(req(libc::PTRACE_SINGLESTEP, pid, 0, 0), 0);
    }

    pub(crate) fn step(pid: i32) {
        start_step(pid);
        assert_eq!(wait(pid), Ok(libc::SIGTRAP), "single step");
    }

    pub(crate) fn cont(pid: i32) {
        assert_eq!(req(libc::PTRACE_CONT, pid, 0, 0), 0);
    }

    #[cfg(target_arch = "x86_64")]
    type Regs = libc::user_regs_struct;
    #[cfg(target_arch = "aarch64")]
    type Regs = libc::user_regs_struct;

    fn regs(pid: i32) -> Regs {
        // SAFETY: all-zero is a valid value of this plain C struct.
        let mut r: Regs = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: (&raw mut r).cast(),
            iov_len: size_of::<Regs>(),
        };
        let rc = req(
            libc::PTRACE_GETREGSET,
            pid,
            1, /* NT_PRSTATUS */
            (&raw mut iov) as usize,
        );
        assert_eq!(rc, 0, "GETREGSET: {}", std::io::Error::last_os_error());
        r
    }

    fn set_regs(pid: i32, mut r: Regs) {
        let mut iov = libc::iovec {
            iov_base: (&raw mut r).cast(),
            iov_len: size_of::<Regs>(),
        };
        let rc = req(libc::PTRACE_SETREGSET, pid, 1, (&raw mut iov) as usize);
        assert_eq!(rc, 0, "SETREGSET: {}", std::io::Error::last_os_error());
    }

    #[cfg(target_arch = "x86_64")]
    pub(crate) fn pc(pid: i32) -> u64 {
        regs(pid).rip
    }
    #[cfg(target_arch = "x86_64")]
    fn set_pc(pid: i32, pc: u64) {
        let mut r = regs(pid);
        r.rip = pc;
        set_regs(pid, r);
    }
    #[cfg(target_arch = "x86_64")]
    const BREAK: (u64, u64, u64) = (0xCC, 0xFF, 1); // int3, its mask, pc after the trap
    #[cfg(target_arch = "aarch64")]
    pub(crate) fn pc(pid: i32) -> u64 {
        regs(pid).pc
    }
    #[cfg(target_arch = "aarch64")]
    fn set_pc(pid: i32, pc: u64) {
        let mut r = regs(pid);
        r.pc = pc;
        set_regs(pid, r);
    }
    #[cfg(target_arch = "aarch64")]
    const BREAK: (u64, u64, u64) = (0xD420_0000, 0xFFFF_FFFF, 0); // brk #0

    fn peek(pid: i32, a: u64) -> u64 {
        // SAFETY: errno is thread-local; cleared so that a -1 word can be told apart.
        unsafe { *libc::__errno_location() = 0 };
        let w = req(libc::PTRACE_PEEKTEXT, pid, a as usize, 0) as u64;
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(0));
        w
    }

    fn poke(pid: i32, a: u64, w: u64) {
        assert_eq!(req(libc::PTRACE_POKETEXT, pid, a as usize, w as usize), 0);
    }

    /// Runs the tracee (stopped at step 0 of a recorded path `pcs`) to step `k`: just
    /// before it executes instruction `k`, with a breakpoint at `pcs[k]` hit as often as
    /// that address occurs before `k` (the path is deterministic: each child is a fresh
    /// fork of the same process doing the same thing).
    pub(crate) fn run_to(pid: i32, pcs: &[u64], k: usize) {
        if k == 0 {
            return;
        }
        let a = pcs[k];
        let occ = pcs[..k].iter().filter(|p| **p == a).count();
        let orig = peek(pid, a);
        let (bp, mask, after) = BREAK;
        let armed = (orig & !mask) | bp;
        let mut hits = 0;
        loop {
            poke(pid, a, armed);
            cont(pid);
            assert_eq!(wait(pid), Ok(libc::SIGTRAP), "breakpoint {a:#x} (k={k})");
            assert_eq!(pc(pid), a + after, "stopped elsewhere (k={k})");
            poke(pid, a, orig);
            set_pc(pid, a);
            if hits == occ {
                return;
            }
            hits += 1;
            step(pid);
        }
    }
}

// ---------------------------------------------------------------------------------------
// 1. A writer frozen at every instruction of a store / an update.
// ---------------------------------------------------------------------------------------

/// The counter of a value (low 32 bits of word 0); the high bits name the writer.
fn ctr(v: &[u64; 6]) -> u64 {
    v[0] & 0xFFFF_FFFF
}

/// An update by writer `id`: the counter plus one, sealed, named `id`.
fn upd(v: &[u64; 6], id: u64) -> [u64; 6] {
    sealed((id << 32) | ((ctr(v) + 1) & 0xFFFF_FFFF))
}

fn code_of(r: Result<Written, WriteError>) -> i32 {
    match r {
        Ok(Written { abandoned: None }) => 0,
        Ok(Written {
            abandoned: Some(Abandoned::Stalled),
        }) => 1,
        Ok(Written {
            abandoned: Some(Abandoned::Died),
        }) => 2,
        Ok(_) => 5,
        Err(WriteError::Superseded) => 3,
        Err(_) => 4,
    }
}

/// The frozen writer's op: 0 = store, 1 = update (both after a first store that reserved
/// its slot), 2 = its first store (reserving a free slot), 3 = its first store
/// (reclaiming a dead process's slot).
fn frozen_child(cell: &SharedCell<[u64; 6]>, op: u32, id: u64) -> ! {
    pt::traceme();
    let warm = sealed((id << 32) | 0xFFFF_0000);
    let mine = sealed((id << 32) | 0x7777_0000);
    if op >= 2 {
        // This process's identity is computed once (reading /proc, a path whose length
        // depends on the numbers read): before the traced part, so that every child takes
        // the same path.
        let _ = cxc_mmf::identity::Identity::current();
        let _ = cxc_mmf::identity::current_proc();
        pt::stop_self();
        let r = cell.store(mine);
        pt::stop_self();
        // SAFETY: ends the forked child without running the parent's exit handlers.
        unsafe { libc::_exit(code_of(r)) }
    }
    let code = match cell.store(warm) {
        Ok(_) => {
            pt::stop_self();
            let r = if op == 0 {
                cell.store(mine)
            } else {
                cell.update(|v| *v = upd(v, id))
            };
            pt::stop_self();
            code_of(r)
        }
        Err(_) => 9,
    };
    // SAFETY: ends the forked child without running the parent's exit handlers.
    unsafe { libc::_exit(code) }
}

/// Forks a frozen writer and waits for its first stop (step 0).
fn fork_frozen(cell: &SharedCell<[u64; 6]>, op: u32, id: u64) -> i32 {
    // SAFETY: the child only uses the cell, ptrace and `_exit` (see `frozen_child`).
    let c = unsafe { libc::fork() };
    assert!(c >= 0);
    if c == 0 {
        frozen_child(cell, op, id);
    }
    assert_eq!(pt::wait(c), Ok(libc::SIGSTOP), "the child's first stop");
    c
}

/// Lets a frozen writer run to its end; its exit code.
fn finish_frozen(c: i32) -> i32 {
    pt::cont(c);
    assert_eq!(pt::wait(c), Ok(libc::SIGSTOP), "the child's second stop");
    pt::cont(c);
    match pt::wait(c) {
        Err(st) if libc::WIFEXITED(st) => libc::WEXITSTATUS(st),
        other => panic!("child {c} ended with {other:?}"),
    }
}

fn kill_frozen(c: i32) {
    // SAFETY: `c` is our traced child, not reaped yet.
    unsafe { libc::kill(c, libc::SIGKILL) };
    loop {
        match pt::wait(c) {
            Err(st) if libc::WIFSIGNALED(st) => return,
            Ok(_) => {}
            Err(st) => panic!("child {c}: {st:#x}"),
        }
    }
}

/// What the recorded path of one op looks like.
struct Path1 {
    /// Program counter before each step (`pcs[k]`: about to execute instruction `k`).
    pcs: Vec<u64>,
    /// First step at which loads show the writer's value.
    pub_at: usize,
    /// Steps at which the writer holds the update claim (update only).
    claim: std::ops::Range<usize>,
    /// Steps after which some shared word changed.
    events: Vec<usize>,
    /// Steps at which the watched writer slot is `BUSY` (ops 2 and 3).
    busy: std::ops::Range<usize>,
}

/// Tracer-side checks of one run (loads, C2, timings); violations are reported.
struct Judge {
    seen: HashSet<[u64; 6]>,
    last: [u64; 6],
    violations: Vec<String>,
    slowest_store: Duration,
    slow_stores: u64,
    stores: u64,
}

impl Judge {
    fn load(&mut self, cell: &SharedCell<[u64; 6]>) -> [u64; 6] {
        let v = cell.load();
        if !intact(&v) {
            self.bad(format!("torn load {v:x?}"));
        }
        if v != self.last {
            if !self.seen.insert(v) {
                self.bad(format!("went back to {:#x}", v[0]));
            }
            self.last = v;
        }
        v
    }

    fn bad(&mut self, s: String) {
        if self.violations.len() < 8 {
            report(format!("VIOLATION {s}"));
        }
        self.violations.push(s);
    }

    fn expect(&mut self, what: &str, k: usize, got: [u64; 6], want: [u64; 6]) {
        if got != want {
            self.bad(format!(
                "{what} k={k}: load {:#x}, expected {:#x}",
                got[0], want[0]
            ));
        }
    }

    fn store(&mut self, cell: &SharedCell<[u64; 6]>, v: [u64; 6]) {
        let t = Instant::now();
        let r = cell.store(v);
        let took = t.elapsed();
        if r.is_err() {
            self.bad(format!("store failed: {r:?}"));
        }
        self.stores += 1;
        self.slowest_store = self.slowest_store.max(took);
        self.slow_stores += u64::from(took > Duration::from_millis(10));
    }
}

fn record_path(cell: &SharedCell<[u64; 6]>, w: &Watch, op: u32, id: u64, slot: usize) -> Path1 {
    let c = fork_frozen(cell, op, id);
    let before = cell.load();
    let (mut busy_from, mut busy_to) = (None, None);
    let want = if op != 1 {
        sealed((id << 32) | 0x7777_0000)
    } else {
        upd(&before, id)
    };
    let mut pcs = vec![pt::pc(c)];
    let (mut pub_at, mut claim_from, mut claim_to) = (None, None, None);
    let mut events = Vec::new();
    let mut h = w.state_hash();
    loop {
        let k = pcs.len() - 1;
        let v = cell.load();
        if pub_at.is_none() && v == want {
            pub_at = Some(k);
        }
        assert!(v == before || v == want, "k={k}: load {v:x?}");
        if op == 1 && w.claim_held() {
            claim_from.get_or_insert(k);
        } else if claim_from.is_some() {
            claim_to.get_or_insert(k);
        }
        if w.word(SLOTS_AT + 64 * slot) & 3 == 1 {
            busy_from.get_or_insert(k);
        } else if busy_from.is_some() {
            busy_to.get_or_insert(k);
        }
        pt::start_step(c);
        match pt::wait(c) {
            Ok(libc::SIGTRAP) => {}
            Ok(libc::SIGSTOP) => break,
            other => panic!("k={k}: {other:?}"),
        }
        pcs.push(pt::pc(c));
        let h2 = w.state_hash();
        if h2 != h {
            events.push(k + 1);
            h = h2;
        }
    }
    let code = {
        pt::cont(c);
        match pt::wait(c) {
            Err(st) if libc::WIFEXITED(st) => libc::WEXITSTATUS(st),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(code, 0, "the recorded op failed");
    let n = pcs.len() - 1;
    Path1 {
        pcs,
        pub_at: pub_at.expect("the op published"),
        claim: claim_from.unwrap_or(n)..claim_to.unwrap_or(n),
        events,
        busy: busy_from.unwrap_or(n)..busy_to.unwrap_or(n),
    }
}

/// The order in which a run visits the steps of a path of `n`: the neighbourhoods of the
/// steps where shared words change first, then every `512`th step, every `256`th, ...,
/// every step (a run cut short by its time budget has covered the path evenly).
fn visit_order(n: usize, p: &Path1) -> Vec<usize> {
    let mut done = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut hot: Vec<usize> = p.events.clone();
    hot.extend([
        0,
        p.pub_at,
        p.claim.start,
        p.claim.end,
        p.busy.start,
        p.busy.end,
        n - 1,
    ]);
    for h in hot {
        for (k, d) in done
            .iter_mut()
            .enumerate()
            .take((h + 3).min(n))
            .skip(h.saturating_sub(3))
        {
            if !*d {
                *d = true;
                order.push(k);
            }
        }
    }
    let mut s = 512;
    while s >= 1 {
        for k in (0..n).step_by(s) {
            if !done[k] {
                done[k] = true;
                order.push(k);
            }
        }
        s /= 2;
    }
    order
}

/// Role: records the path of one op (`op` 0 = store, 1 = update) of a frozen writer, then
/// forks a fresh writer per visited step `k`, freezes it just before instruction `k` and
/// plays `variant` there: `kill` (SIGKILL, then this process updates and stores),
/// `stall_store` / `stall_update` (this process stores / updates while the writer is
/// frozen, then the writer runs to its end). Reports violations and a summary.
fn role_frozen() {
    let path = path_arg("path");
    let op: u32 = arg("op").parse().unwrap();
    let variant = arg("variant");
    let budget = Duration::from_secs(arg("budget_s").parse().unwrap());
    let mut cell = SharedCell::<[u64; 6]>::open(&path).unwrap();
    cell.set_stall_timeout(if variant == "stall_update" {
        Duration::from_millis(2)
    } else {
        Duration::from_secs(10)
    });
    let w = Watch::new(&path);
    let mut next = 0u64;
    let mut id = || {
        next += 1;
        next
    };
    let mut j = Judge {
        seen: HashSet::new(),
        last: [0; 6],
        violations: Vec::new(),
        slowest_store: Duration::ZERO,
        slow_stores: 0,
        stores: 0,
    };
    j.store(&cell, sealed(id() << 32));
    // The slot of this process, and the one the frozen writers of ops 2 and 3 take.
    let my_slot = (0..32)
        .find(|i| {
            w.word(SLOTS_AT + 64 * i) & 3 == 2 && w.word(SLOTS_AT + 64 * i + 8) == u64::from(me())
        })
        .expect("this process's slot");
    let x = usize::from(my_slot == 0);
    let my_ident = cxc_mmf::identity::Identity::current().to_words();
    let dead_ident = {
        // SAFETY: the child only sleeps until killed.
        let c = unsafe { libc::fork() };
        if c == 0 {
            loop {
                // SAFETY: pause has no preconditions.
                unsafe { libc::pause() };
            }
        }
        let id = cxc_mmf::identity::Identity::of_pid(c as u32).expect("a live child");
        kill_frozen(c);
        id.to_words()
    };
    // Before each frozen writer of ops 2/3, the table is put back in the same state (so
    // that every writer takes the same path): op 2, every other slot free; op 3, slot `x`
    // reserved by a dead process that holds the update claim, every other slot reserved
    // by this (live) process.
    let prepare = || {
        if op < 2 {
            return;
        }
        for i in (0..32).filter(|i| *i != my_slot) {
            let st = w.word(SLOTS_AT + 64 * i) & !3;
            if op == 2 {
                patch(&path, SLOTS_AT + 64 * i, st);
                continue;
            }
            let ident = if i == x { dead_ident } else { my_ident };
            for (k, word) in ident.iter().enumerate() {
                patch(&path, SLOTS_AT + 64 * i + 8 + 8 * k, *word);
            }
            patch(&path, SLOTS_AT + 64 * i, st | 2);
        }
        if op == 3 {
            let c = w.word(CLAIM_WORD);
            patch(&path, CLAIM_WORD, (((c >> 8) + 1) << 8) | (x as u64 + 1));
        }
    };
    prepare();
    let p = record_path(&cell, &w, op, id(), x);
    // The last step is this child's own SIGSTOP (delivered before the instruction after
    // its system call), not a point of the op.
    let n = p.pcs.len() - 1;
    report(format!(
        "PATH steps={n} pub_at={} claim={:?} busy={:?} events={:?}",
        p.pub_at, p.claim, p.busy, p.events
    ));
    let mut leaked = 0u64;
    let started = Instant::now();
    let (mut visited, mut superseded_at, mut ok_after_t_at) = (0usize, Vec::new(), Vec::new());
    let (mut slowest_update, mut stalled, mut died) = (Duration::ZERO, 0u64, 0u64);
    for k in visit_order(n, &p) {
        if started.elapsed() > budget {
            break;
        }
        visited += 1;
        let cid = id();
        prepare();
        let c = fork_frozen(&cell, op, cid);
        let b = j.load(&cell);
        if op < 2 {
            j.expect("warm store", k, b, sealed((cid << 32) | 0xFFFF_0000));
        }
        pt::run_to(c, &p.pcs, k);
        let mine = if op != 1 {
            sealed((cid << 32) | 0x7777_0000)
        } else {
            upd(&b, cid)
        };
        let frozen = j.load(&cell);
        j.expect("frozen", k, frozen, if k >= p.pub_at { mine } else { b });
        let held = w.claim_held();
        if op == 1 && held != p.claim.contains(&k) {
            j.bad(format!("k={k}: claim held={held}, path says {:?}", p.claim));
        }
        // This process updates: at once, or after the stall timeout if the frozen writer
        // holds the claim; told `Died` / `Stalled` exactly when it took the claim over.
        let mut update = |j: &mut Judge, from: [u64; 6], dead: bool| {
            let tid = id();
            let t = Instant::now();
            let r = code_of(cell.update(|v| *v = upd(v, tid)));
            let took = t.elapsed();
            slowest_update = slowest_update.max(took);
            let want = match (op, held, dead) {
                (2, ..) => 0,
                (3, ..) => 2,
                (_, false, _) => 0,
                (_, true, false) => 1,
                (_, true, true) => 2,
            };
            stalled += u64::from(r == 1);
            died += u64::from(r == 2);
            if r != want {
                j.bad(format!(
                    "k={k}: update returned code {r}, expected {want} (held={held})"
                ));
            }
            if took > Duration::from_secs(1) {
                j.bad(format!("k={k}: update took {took:?}"));
            }
            let u = j.load(&cell);
            j.expect("after update", k, u, upd(&from, tid));
            u
        };
        match variant.as_str() {
            "kill" => {
                kill_frozen(c);
                let after = j.load(&cell);
                j.expect("after kill", k, after, frozen);
                if op >= 2 {
                    // Killed between BUSY and VALID, the slot leaks (documented); anywhere
                    // else it does not.
                    let busy = w.word(SLOTS_AT + 64 * x) & 3 == 1;
                    leaked += u64::from(busy);
                    if busy != p.busy.contains(&k) {
                        j.bad(format!(
                            "k={k}: slot {x} busy={busy} after the kill, path says {:?}",
                            p.busy
                        ));
                    }
                }
                if op != 0 {
                    update(&mut j, after, true);
                }
                let tv = sealed(id() << 32);
                j.store(&cell, tv);
                let v = j.load(&cell);
                j.expect("after store", k, v, tv);
            }
            "stall_store" => {
                let tv = sealed((id() << 32) | 0x5555_0000);
                j.store(&cell, tv);
                let v = j.load(&cell);
                j.expect("stored beside the frozen writer", k, v, tv);
                let code = finish_frozen(c);
                let fin = j.load(&cell);
                if op == 0 {
                    if code != 0 {
                        j.bad(format!("k={k}: the resumed store returned code {code}"));
                    }
                    // A blind store not yet published retries and lands after ours.
                    j.expect(
                        "resumed store",
                        k,
                        fin,
                        if k >= p.pub_at { tv } else { mine },
                    );
                } else if k >= p.pub_at {
                    j.expect("resumed published update", k, fin, tv);
                    if code != 0 {
                        j.bad(format!("k={k}: published update returned {code}"));
                    }
                } else {
                    match code {
                        0 => {
                            ok_after_t_at.push(k);
                            j.expect(
                                "resumed update (read after our store)",
                                k,
                                fin,
                                upd(&tv, cid),
                            );
                        }
                        3 => {
                            superseded_at.push(k);
                            j.expect("superseded update", k, fin, tv);
                        }
                        c => j.bad(format!("k={k}: resumed update returned code {c}")),
                    }
                }
            }
            "stall_update" => {
                let u = update(&mut j, frozen, false);
                let code = finish_frozen(c);
                let fin = j.load(&cell);
                if k >= p.pub_at {
                    j.expect("resumed published update", k, fin, u);
                    if code != 0 {
                        j.bad(format!("k={k}: published update returned {code}"));
                    }
                } else {
                    match code {
                        0 => {
                            ok_after_t_at.push(k);
                            j.expect("resumed update (read after ours)", k, fin, upd(&u, cid));
                        }
                        3 => {
                            superseded_at.push(k);
                            j.expect("superseded update", k, fin, u);
                        }
                        c => j.bad(format!("k={k}: resumed update returned code {c}")),
                    }
                }
            }
            v => panic!("variant {v}"),
        }
        if w.claim_held() {
            j.bad(format!(
                "k={k}: the update claim is still held after the round"
            ));
        }
    }
    // An update reads once: the steps at which it is superseded form one range that
    // ends where it publishes, after every step at which it still read our value.
    superseded_at.sort_unstable();
    ok_after_t_at.sort_unstable();
    if let (Some(first_sup), Some(last_ok)) = (superseded_at.first(), ok_after_t_at.last())
        && last_ok > first_sup
    {
        j.bad(format!(
            "an update frozen at step {first_sup} was superseded but one frozen at {last_ok} \
             (later) read the newer value"
        ));
    }
    report(format!(
        "DONE visited={visited} steps={n} violations={} stores={} slowest_store_us={} \
         slow_stores={} slowest_update_us={} stalled={stalled} died={died} superseded={} \
         read_after={} first_superseded={:?} leaked={leaked} counters={:?}",
        j.violations.len(),
        j.stores,
        j.slowest_store.as_micros(),
        j.slow_stores,
        slowest_update.as_micros(),
        superseded_at.len(),
        ok_after_t_at.len(),
        superseded_at.first(),
        cell.counters(),
    ));
}

/// Role: loads until `stop` exists, checking C1 (whole values) and C2 (a value once left
/// never comes back: every publication in these tests is unique).
fn role_checker() {
    let cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
    let stop = path_arg("stop");
    report("ready");
    let (mut loads, mut torn, mut back) = (0u64, 0u64, 0u64);
    let mut seen = HashSet::new();
    let mut last = [0u64; 6];
    while !stop.exists() {
        for _ in 0..200 {
            let v = cell.load();
            loads += 1;
            torn += u64::from(!intact(&v));
            if v != last {
                back += u64::from(!seen.insert(v));
                last = v;
            }
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    report(format!(
        "loads={loads} torn={torn} back={back} distinct={}",
        seen.len()
    ));
}

fn frozen_test(test: &str, op: u32, variant: &str, budget_s: u64) {
    play_role!(role_frozen, role_checker);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("frozen.cell");
    let stop = d.path().join("stop");
    drop(SharedCell::<[u64; 6]>::create(&path, sealed(0)).unwrap());
    let mut checker = RoleCommand::new(test, "checker")
        .arg("path", &path)
        .arg("stop", &stop)
        .spawn();
    checker.next_report(REPORT_WAIT);
    let mut tracer = RoleCommand::new(test, "frozen")
        .arg("path", &path)
        .arg("op", op.to_string())
        .arg("variant", variant)
        .arg("budget_s", budget_s.to_string())
        .spawn();
    let lines = tracer.finish(CHILD_DEADLINE);
    std::fs::write(&stop, b"").unwrap();
    let c = checker.finish(CHILD_DEADLINE).pop().unwrap();
    for l in &lines {
        println!("{l}");
    }
    println!("checker: {c}");
    let done = lines.iter().find(|l| l.starts_with("DONE")).unwrap();
    let path_line = lines.iter().find(|l| l.starts_with("PATH")).unwrap();
    let bad: Vec<_> = lines
        .iter()
        .filter(|l| l.starts_with("VIOLATION"))
        .collect();
    assert!(bad.is_empty(), "{bad:#?}\n{done}");
    assert_eq!(num(done, "violations"), 0, "{done}");
    assert_eq!((num(&c, "torn"), num(&c, "back")), (0, 0), "checker: {c}");
    // The whole path, or at least a fair sample of it on a slow machine.
    let (visited, steps) = (num(done, "visited"), num(path_line, "steps"));
    assert!(
        visited >= steps.min(400),
        "only {visited} of {steps} steps visited within the budget: {done}"
    );
    assert!(
        num(done, "slow_stores") * 100 <= num(done, "stores").max(100),
        "more than 1% of the stores beside a frozen or killed writer took > 10 ms: {done}"
    );
    assert!(
        num(done, "slowest_store_us") < 1_000_000,
        "a store beside a frozen or killed writer took a second: {done}"
    );
}

const FROZEN_STORE_KILL: &str = "frozen_store_killed_before_every_instruction";

/// S1/S3 (docs/seqlock.md): "A writer that stalls or dies before its CAS has published
/// nothing: its bytes sit in a buffer that no reader is directed to"; shared-cell.md: "A
/// writer SIGKILLed ... anywhere in a store has published nothing and blocks nobody".
/// A writer process is frozen before each instruction of a `store` in turn (a fresh fork
/// per step, stopped there by a breakpoint), loads are checked (the old value before the
/// CAS, the new one after, never anything else), then it is SIGKILLed: the value stays,
/// and a store and an update of another process complete at once (`Died` exactly when
/// the dead writer held the update claim: never, for a store).
#[test]
fn frozen_store_killed_before_every_instruction() {
    frozen_test(FROZEN_STORE_KILL, 0, "kill", 30);
}

const FROZEN_STORE_STALL: &str = "frozen_store_stalled_before_every_instruction_beside_a_store";

/// docs/seqlock.md: "`write` never waits for another writer"; "a `write` (a blind store
/// ...) retries the CAS against the newer value it has now seen, so it never replaces a
/// value it has not seen"; "returns once `T` is published". A writer frozen before each
/// instruction of a `store`; another process stores meanwhile (at once), then the frozen
/// one runs on: if it had not published yet, its value must land after the other's; if it
/// had, the other's must stay.
#[test]
fn frozen_store_stalled_before_every_instruction_beside_a_store() {
    frozen_test(FROZEN_STORE_STALL, 0, "stall_store", 30);
}

const FROZEN_UPDATE_KILL: &str = "frozen_update_killed_before_every_instruction";

/// docs/seqlock.md (Update): a waiting updater "takes over at once" a holder whose
/// process is dead; `Written::abandoned` "`Some` if this `update` took the update claim
/// from an updater that died or stalled holding it"; S3. An updater frozen before each
/// instruction of an `update` and SIGKILLed there: loads show the old value or its whole
/// result; the next update (stall timeout 10 s) gets the claim at once, told `Died`
/// exactly when the dead one held it; a store completes at once.
#[test]
fn frozen_update_killed_before_every_instruction() {
    frozen_test(FROZEN_UPDATE_KILL, 1, "kill", 35);
}

const FROZEN_FIRST_FREE: &str =
    "frozen_first_store_reserving_a_free_slot_killed_before_every_instruction";

/// docs/seqlock.md (Writer slots): "The first write of a thread through a handle reserves
/// a free slot (CAS `FREE → BUSY`, write the identity, store `VALID`)"; (Pitfalls) "A
/// process killed in the instant between a slot's `BUSY` and `VALID` states leaks that
/// slot". A process frozen before each instruction of its first store (reservation
/// included) and SIGKILLed there: the slot leaks exactly when it was killed between
/// `BUSY` and `VALID` (the window is reported), never elsewhere; nothing is published
/// before the CAS; other writers go on at once.
#[test]
fn frozen_first_store_reserving_a_free_slot_killed_before_every_instruction() {
    frozen_test(FROZEN_FIRST_FREE, 2, "kill", 30);
}

const FROZEN_FIRST_RECLAIM: &str =
    "frozen_first_store_reclaiming_a_dead_holders_slot_killed_before_every_instruction";

/// docs/seqlock.md (Writer slots): "if none is free, it reclaims the slot of a process
/// the OS proves dead ... If that process died holding the update claim, the reclaimer
/// frees the claim with a *died* flag before the slot gets its new owner ... the next
/// updater takes the flagged claim at once and is told `Abandoned::Died`". The table is
/// full, one slot belongs to a dead process holding the update claim; a process frozen
/// before each instruction of its first store (which reclaims that slot) is SIGKILLed
/// there: the next update (stall timeout 10 s) must get the claim at once and be told
/// `Died` wherever the reclaimer died, and the slot leaks only between `BUSY` and `VALID`.
#[test]
fn frozen_first_store_reclaiming_a_dead_holders_slot_killed_before_every_instruction() {
    frozen_test(FROZEN_FIRST_RECLAIM, 3, "kill", 30);
}

const FROZEN_UPDATE_STORE: &str = "frozen_update_stalled_before_every_instruction_beside_a_store";

/// docs/seqlock.md: "`update(f)` ... publishes only if nothing was published since its
/// input was read, else it returns `Err(Superseded)`"; S5. An updater frozen before each
/// instruction; another process stores meanwhile; the updater runs on: `Superseded` (the
/// store stays) exactly from its read to its publication, `Ok` over the store's value
/// before its read, `Ok` (the store on top) after its publication.
#[test]
fn frozen_update_stalled_before_every_instruction_beside_a_store() {
    frozen_test(FROZEN_UPDATE_STORE, 1, "stall_store", 35);
}

const FROZEN_UPDATE_UPDATE: &str =
    "frozen_update_stalled_before_every_instruction_beside_an_update";

/// docs/seqlock.md: a waiting updater "takes over a holder that keeps the same claim
/// longer than the stall timeout"; "A superseded holder cannot publish over a newer
/// value"; S5. An updater frozen before each instruction; another process updates (stall
/// timeout 2 ms): `Stalled` exactly when the frozen one holds the claim, else no wait;
/// the frozen one runs on and every `Ok` counts exactly once.
#[test]
fn frozen_update_stalled_before_every_instruction_beside_an_update() {
    frozen_test(FROZEN_UPDATE_UPDATE, 1, "stall_update", 35);
}

// ---------------------------------------------------------------------------------------
// 2. A full table whose 32nd slot belongs to a half-exited, stopped or unreaped writer.
// ---------------------------------------------------------------------------------------

/// Role: takes 31 writer slots (31 threads alive at once, one store each; the handle
/// keeps their slots) and lives on.
fn role_filler() {
    let cell: &'static SharedCell<[u64; 6]> =
        Box::leak(Box::new(SharedCell::open(path_arg("path")).unwrap()));
    let barrier: &'static std::sync::Barrier = Box::leak(Box::new(std::sync::Barrier::new(31)));
    let ok = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..31u64 {
            let ok = &ok;
            s.spawn(move || {
                ok.fetch_add(
                    u64::from(cell.store(sealed((1 << 60) | t)).is_ok()),
                    Ordering::Relaxed,
                );
                barrier.wait();
            });
        }
    });
    report(format!("FILLED ok={}", ok.load(Ordering::Relaxed)));
    cxc_testkit::sleep_forever();
}

/// Role: the 32nd writer. `mode` `half`: stores, ends its main thread, stores on from its
/// other thread; `late`: ends its main thread before it opens the cell; `still`: stores
/// once and sleeps (the parent stops or kills it).
fn role_holder32() {
    let mode = arg("mode");
    let tag: u64 = arg("tag").parse().unwrap();
    if mode == "late" {
        assert!(
            cxc_testkit::exit_main_thread(),
            "the main thread did not exit"
        );
    }
    let cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
    cell.store(sealed(tag << 32))
        .expect("the 32nd slot is free");
    if mode == "half" {
        assert!(
            cxc_testkit::exit_main_thread(),
            "the main thread did not exit"
        );
    }
    report(format!(
        "HELD main_exited={}",
        cxc_testkit::main_thread_exited()
    ));
    if mode == "still" {
        cxc_testkit::sleep_forever();
    }
    let mut i = 0u64;
    loop {
        i += 1;
        cell.store(sealed((tag << 32) | (i & 0xFFFF_FFFF)))
            .expect("a live writer's slot was taken from it");
        if i.is_multiple_of(64) {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

const FULL_TABLE: &str = "full_table_never_reclaims_a_live_half_exited_or_stopped_writers_slot";

/// docs/seqlock.md (Writer slots): "if none is free, it reclaims the slot of a process
/// the OS proves dead"; (Pitfalls) "A 33rd writer gets `NoWriterSlot` unless a slot
/// belongs to a dead process"; identity: a main thread that exited while others run is
/// not dead. 31 slots taken by a filler, the 32nd by a writer whose main thread exited
/// (after its first store, or before it opened the cell; pidfs and fallback identity),
/// a SIGSTOPped writer, or a SIGKILLed but unreaped one: a newcomer's stores must be
/// refused for 300 ms while the writer lives (the half-exited one storing on, its values
/// whole), and succeed at once once it is dead (unreaped: dead already).
#[test]
fn full_table_never_reclaims_a_live_half_exited_or_stopped_writers_slot() {
    play_role!(role_filler, role_holder32);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("full.cell");
    let cell = SharedCell::<[u64; 6]>::create(&path, sealed(0)).unwrap();
    let mut filler = RoleCommand::new(FULL_TABLE, "filler")
        .arg("path", &path)
        .spawn();
    let f = filler.next_report(REPORT_WAIT);
    assert_eq!(num(&f, "ok"), 31, "{f}");
    let cases = [
        ("half", false, "alive"),
        ("half", true, "alive"),
        ("late", false, "alive"),
        ("late", true, "alive"),
        ("still", false, "stopped"),
        ("still", true, "stopped"),
        ("still", false, "zombie"),
        ("still", true, "zombie"),
    ];
    for (tag, (mode, fallback, state)) in (2u64..).zip(cases) {
        let what = format!("mode={mode} fallback={fallback} state={state}");
        let mut cmd = RoleCommand::new(FULL_TABLE, "holder32")
            .arg("path", &path)
            .arg("mode", mode)
            .arg("tag", tag.to_string());
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut holder = cmd.spawn();
        let h = holder.next_report(REPORT_WAIT);
        assert_eq!(
            h.contains("main_exited=true"),
            mode != "still",
            "{what}: {h}"
        );
        match state {
            "stopped" => {
                holder.stop();
                holder.wait_state('T', REPORT_WAIT);
            }
            "zombie" => {
                holder.kill_unreaped();
                holder.wait_state('Z', REPORT_WAIT);
            }
            _ => {}
        }
        let newcomer = SharedCell::<[u64; 6]>::open(&path).unwrap();
        if state == "zombie" {
            // `Z` shows once the main thread is gone; the whole group (the OS's proof of
            // death) follows within moments: the store must succeed once it has.
            let t = Instant::now();
            let mut tries = 0u32;
            let mut r = Err(WriteError::NoWriterSlot);
            while r.is_err() && t.elapsed() < Duration::from_secs(1) {
                tries += 1;
                r = newcomer.store(sealed(tag << 32 | 0xAAAA));
            }
            println!("{what}: reclaimed after {tries} tries, {:?}", t.elapsed());
            assert!(
                r.is_ok(),
                "{what}: the slot of a dead (unreaped) writer was not reclaimed: {r:?} after {:?}",
                t.elapsed()
            );
        } else {
            let until = Instant::now() + Duration::from_millis(300);
            let (mut tries, mut theirs) = (0u64, HashSet::new());
            while Instant::now() < until {
                tries += 1;
                let r = newcomer.store(sealed(tag << 32 | 0xBBBB));
                assert_eq!(
                    r,
                    Err(WriteError::NoWriterSlot),
                    "{what}: a newcomer got a slot beside 32 live writers (try {tries})"
                );
                let v = cell.load();
                assert!(intact(&v), "{what}: torn {v:x?}");
                if v[0] >> 32 == tag {
                    theirs.insert(v[0]);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            if state == "alive" {
                assert!(
                    theirs.len() > 2,
                    "{what}: the half-exited writer did not store on ({theirs:?})"
                );
            }
            holder.kill();
            let t = Instant::now();
            let r = newcomer.store(sealed(tag << 32 | 0xCCCC));
            assert!(
                r.is_ok() && t.elapsed() < Duration::from_secs(1),
                "{what}: killed, its slot was not reclaimed: {r:?} after {:?}",
                t.elapsed()
            );
        }
        assert_eq!(cell.load(), newcomer.load());
        assert!(intact(&cell.load()));
        println!("{what}: held; counters {:?}", cell.counters());
        holder.kill();
    }
}

// ---------------------------------------------------------------------------------------
// 3. An update claim held by a half-exited process.
// ---------------------------------------------------------------------------------------

/// Role: holds the update claim inside its closure until `release` exists, its main
/// thread ended (`mode` `early`: after its first store; `late`: before it opened the
/// cell); reports the update's result.
fn role_claimer() {
    let mode = arg("mode");
    let release = path_arg("release");
    if mode == "late" {
        assert!(cxc_testkit::exit_main_thread());
    }
    let cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
    cell.store(sealed(3 << 32)).unwrap();
    if mode == "early" {
        assert!(cxc_testkit::exit_main_thread());
    }
    let r = cell.update(|v| {
        report(format!(
            "IN main_exited={}",
            cxc_testkit::main_thread_exited()
        ));
        while !release.exists() {
            std::thread::sleep(Duration::from_millis(1));
        }
        *v = upd(v, 3);
    });
    report(format!("OUT code={}", code_of(r)));
    cxc_testkit::sleep_forever();
}

const HALF_CLAIM: &str = "update_claim_of_a_half_exited_holder_is_stalled_not_dead";

/// docs/seqlock.md (Update): "asks the OS every 500 µs whether the holder's process is
/// dead ... and takes over at once if it is, and takes over a holder that keeps the same
/// claim longer than the stall timeout"; `Abandoned::Died`: "Its process died holding the
/// update claim (the OS proved it)". A holder whose main thread exited is alive: an
/// updater with a 1.5 s stall timeout must wait it out and be told `Stalled` (a wrong
/// `Died` would come after ~1 ms), and the holder's update must then be refused
/// (`Superseded`). Killed inside its closure, a holder is replaced at once (`Died`), with
/// a 10 s stall timeout. pidfs and fallback identity.
#[test]
fn update_claim_of_a_half_exited_holder_is_stalled_not_dead() {
    play_role!(role_claimer);
    let _s = serial();
    for (mode, fallback, kill) in [
        ("early", false, false),
        ("early", true, false),
        ("late", false, false),
        ("late", true, false),
        ("early", false, true),
        ("late", true, true),
    ] {
        let what = format!("mode={mode} fallback={fallback} kill={kill}");
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("claim.cell");
        let release = d.path().join("release");
        let mut cell = SharedCell::<[u64; 6]>::create(&path, sealed(0)).unwrap();
        let mut cmd = RoleCommand::new(HALF_CLAIM, "claimer")
            .arg("path", &path)
            .arg("mode", mode)
            .arg("release", &release);
        if fallback {
            cmd = cmd.env("CXC_IDENTITY_FALLBACK", "1");
        }
        let mut holder = cmd.spawn();
        let line = holder.next_report(REPORT_WAIT);
        assert!(line.contains("main_exited=true"), "{what}: {line}");
        let before = cell.load();
        if kill {
            holder.kill();
            cell.set_stall_timeout(Duration::from_secs(10));
        } else {
            cell.set_stall_timeout(Duration::from_millis(1500));
        }
        let t = Instant::now();
        let r = cell.update(|v| *v = upd(v, 9));
        let took = t.elapsed();
        println!("{what}: {r:?} after {took:?}");
        if kill {
            assert_eq!(
                r,
                Ok(Written {
                    abandoned: Some(Abandoned::Died)
                }),
                "{what}"
            );
            assert!(took < Duration::from_secs(1), "{what}: waited {took:?}");
        } else {
            assert_eq!(
                r,
                Ok(Written {
                    abandoned: Some(Abandoned::Stalled)
                }),
                "{what}: a live half-exited holder was judged {r:?} after {took:?}"
            );
            assert!(
                took >= Duration::from_millis(1400),
                "{what}: superseded after {took:?}, before the stall timeout"
            );
            std::fs::write(&release, b"").unwrap();
            let out = holder.next_report(REPORT_WAIT);
            assert_eq!(
                num(&out, "code"),
                3,
                "{what}: the stalled holder's update: {out}"
            );
        }
        assert_eq!(cell.load(), upd(&before, 9), "{what}");
    }
}

// ---------------------------------------------------------------------------------------
// 4. Pid reuse: a dead claim holder's pid handed to a fork descendant with its handle.
// ---------------------------------------------------------------------------------------

/// Role `holder` of the pid-reuse scenario (P, pid X): stores, forks C (which waits for
/// `fork_now` and then forks G, given pid X by the scenario), and holds the update claim
/// in its closure until killed. G, with a copy of P's handle (P's lanes, stall timeout
/// 10 s), stores, updates and stores again, and writes its line to `result`.
fn role_reuse_holder() {
    let d = procs::dir();
    let mut cell = SharedCell::<[u64; 6]>::open(d.join("cell")).unwrap();
    cell.set_stall_timeout(Duration::from_secs(10));
    cell.store(sealed(1 << 32)).unwrap();
    let cell: &'static SharedCell<[u64; 6]> = Box::leak(Box::new(cell));
    // SAFETY: the child only waits for a file, forks, and the grandchild uses the cell
    // and writes a file.
    let c = unsafe { libc::fork() };
    assert!(c >= 0);
    if c == 0 {
        cxc_testkit::child_wait_for_path(&d.join("fork_now"), Duration::from_secs(30));
        // SAFETY: as above.
        let g = unsafe { libc::fork() };
        if g == 0 {
            let s1 = cell.store(sealed(2 << 32)).is_ok();
            let t = Instant::now();
            let r = code_of(cell.update(|v| *v = upd(v, 2)));
            let took = t.elapsed().as_micros();
            let s2 = cell.store(sealed((2 << 32) | 0xFFFF)).is_ok();
            let line = format!(
                "pid={} store_ok={s1} update_code={r} took_us={took} store2_ok={s2}",
                me()
            );
            std::fs::write(d.join("result.tmp"), line).unwrap();
            std::fs::rename(d.join("result.tmp"), d.join("result")).unwrap();
        }
        cxc_testkit::sleep_forever();
    }
    let _ = cell.update(|_| {
        report("HELD");
        cxc_testkit::sleep_forever();
    });
    unreachable!();
}

/// The pid-reuse scenario, as pid 1 of a fresh pid namespace.
fn reuse_scenario(test: &str) {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only sets this process's parent-death signal.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    procs::mount_own_proc();
    let d = procs::dir();
    let cell: &'static SharedCell<[u64; 6]> = Box::leak(Box::new(
        SharedCell::<[u64; 6]>::create(d.join("cell"), sealed(0)).unwrap(),
    ));
    let mut holder = procs::spawn(test, "holder", &d, &[]);
    procs::wait_line(&mut holder, "HELD");
    let x = holder.pid();
    holder.kill();
    std::thread::sleep(Duration::from_millis(30));
    std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", x - 1)).unwrap();
    std::fs::write(d.join("fork_now"), b"").unwrap();
    assert!(
        cxc_testkit::wait_for_path(&d.join("result"), Duration::from_secs(20)),
        "the heir never reported"
    );
    let line = std::fs::read_to_string(d.join("result")).unwrap();
    println!("heir with the dead holder's pid {x}: {line}");
    assert_eq!(num(&line, "pid"), u64::from(x), "harness: the heir's pid");
    assert!(
        cxc_testkit::flag(&line, "store_ok") && cxc_testkit::flag(&line, "store2_ok"),
        "{line}"
    );
    assert_eq!(
        num(&line, "update_code"),
        2,
        "the heir (pid {x}) must take the dead holder's claim as Died: {line}"
    );
    assert!(
        num(&line, "took_us") < 1_000_000,
        "the heir waited for the dead holder's claim: {line}"
    );
    // The claim is free again.
    let t = Instant::now();
    assert_eq!(cell.update(|v| *v = upd(v, 5)), Ok(Written::default()));
    assert!(t.elapsed() < Duration::from_secs(1));
    // Fill the table: the dead holder's slot is the only one to reclaim, the heir's
    // (same pid) is live.
    let used = 3; // the dead holder's, the heir's, this thread's
    let barrier = std::sync::Barrier::new(32 - used);
    std::thread::scope(|s| {
        for t in 0..(32 - used) as u64 {
            let barrier = &barrier;
            s.spawn(move || {
                cell.store(sealed((6 << 32) | t)).unwrap();
                barrier.wait();
            });
        }
    });
    let a = SharedCell::<[u64; 6]>::open(d.join("cell")).unwrap();
    let b = SharedCell::<[u64; 6]>::open(d.join("cell")).unwrap();
    let ra = a.store(sealed(7 << 32));
    let rb = b.store(sealed(8 << 32));
    println!("counters {:?}", cell.counters());
    assert!(
        ra.is_ok(),
        "the dead holder's slot was not reclaimed: {ra:?}"
    );
    assert_eq!(
        rb,
        Err(WriteError::NoWriterSlot),
        "a live slot was reclaimed: the heir's (pid {x}, the dead holder's pid)?"
    );
    assert!(intact(&cell.load()));
}

fn reuse_test(test: &str, fallback: bool) {
    match cxc_testkit::role().as_deref() {
        Some("nsroot") => procs::nsroot(test),
        Some("scenario") => {
            reuse_scenario(test);
            std::process::exit(0);
        }
        Some("holder") => role_reuse_holder(),
        Some(other) => panic!("unknown role {other}"),
        None => {
            let _s = serial();
            procs::run_reuse_test(test, fallback);
        }
    }
}

/// docs/seqlock.md (Update): the waiting updater takes over "at once" a holder whose
/// process "is dead (the identity recorded in the holder's slot)"; (Writer slots) "it
/// reclaims the slot of a process the OS proves dead"; identity: a pid reused by a new
/// process is another identity. P holds the update claim and is SIGKILLed; its pid is
/// handed (fresh pid namespace, `ns_last_pid`) to G, a fork descendant of P holding a
/// copy of P's handle: G's update (stall timeout 10 s) must take the claim at once as
/// `Died`; then, with a full table, a newcomer must get P's slot and the next one none
/// (G's slot, same pid, is live). Root only (says SKIPPED otherwise).
#[test]
fn dead_claim_holders_pid_reused_by_an_heir_with_its_handle() {
    reuse_test(
        "dead_claim_holders_pid_reused_by_an_heir_with_its_handle",
        false,
    );
}

/// The same on the fallback identity path (pid + start time).
#[test]
fn dead_claim_holders_pid_reused_by_an_heir_with_its_handle_fallback() {
    reuse_test(
        "dead_claim_holders_pid_reused_by_an_heir_with_its_handle_fallback",
        true,
    );
}

// ---------------------------------------------------------------------------------------
// 5. A process that execs itself.
// ---------------------------------------------------------------------------------------

const EXEC_LEAK: &str = "a_process_that_drops_its_handle_before_each_exec_keeps_no_slot";

/// Role: opens the cell, stores once, reports, drops the handle, and execs itself as
/// generation `gen + 1` (up to `last`), then sleeps.
fn role_execer() {
    let path = path_arg("path");
    let generation: u64 = arg("gen").parse().unwrap();
    let last: u64 = arg("last").parse().unwrap();
    let cell = SharedCell::<[u64; 6]>::open(&path).unwrap();
    let r = cell.store(sealed((0xE << 32) | generation));
    report(format!(
        "GEN gen={generation} pid={} ok={}",
        me(),
        r.is_ok()
    ));
    drop(cell);
    if generation < last {
        use std::os::unix::process::CommandExt;
        let err = RoleCommand::new(EXEC_LEAK, "execer")
            .arg("path", &path)
            .arg("gen", (generation + 1).to_string())
            .arg("last", last.to_string())
            .into_command()
            .exec();
        panic!("exec: {err}");
    }
    report("LAST");
    cxc_testkit::sleep_forever();
}

/// docs/seqlock.md (Pitfalls): "32 writer slots per lock: one per (handle, writing
/// thread) of a live process"; "`exec` keeps the slots of the previous image ... drop its
/// writer handles before each `exec`". One process opens the cell, stores once, drops
/// the handle and execs itself, 40 times: every generation's store succeeds and other
/// processes can still write. (Without the drop, the first version of this test found
/// the 33rd image, and every other process, refused with `NoWriterSlot` until the process
/// exited; the docs did not say so then.)
#[test]
fn a_process_that_drops_its_handle_before_each_exec_keeps_no_slot() {
    play_role!(role_execer);
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("exec.cell");
    let cell = SharedCell::<[u64; 6]>::create(&path, sealed(0)).unwrap();
    let mut p = RoleCommand::new(EXEC_LEAK, "execer")
        .arg("path", &path)
        .arg("gen", "0")
        .arg("last", "39")
        .spawn();
    let mut failed = Vec::new();
    loop {
        let l = p.next_report(REPORT_WAIT);
        if l == "LAST" {
            break;
        }
        if !cxc_testkit::flag(&l, "ok") {
            failed.push(num(&l, "gen"));
        }
    }
    let other = cell.store(sealed(0xF << 32));
    println!(
        "generations refused: {failed:?}; another process's store: {other:?}; counters {:?}",
        cell.counters()
    );
    p.kill();
    let after = cell.store(sealed(0xF << 32 | 1));
    assert!(after.is_ok(), "once it exited: {after:?}");
    assert!(
        failed.is_empty() && other.is_ok(),
        "one process with one handle at a time, 40 images (39 execs): generations \
         {failed:?} got NoWriterSlot, and another process's store returned {other:?}"
    );
}

// ---------------------------------------------------------------------------------------
// 6. Every payload size.
// ---------------------------------------------------------------------------------------

/// A 40-byte payload aligned to 8 with bytes after the aligned field.
#[derive(
    zerocopy::FromBytes,
    zerocopy::IntoBytes,
    zerocopy::Immutable,
    zerocopy::KnownLayout,
    Clone,
    Copy,
    PartialEq,
    Debug,
)]
#[repr(C)]
struct Mixed {
    a: u64,
    b: [u8; 32],
}

/// Round trips of one `[u8; N]` on the heap, in a file (store, update, another handle,
/// `inspect`), and the refusal of the same file as `[u8; N + 1]` and as a same-sized
/// type of another name.
fn sizes_one<const N: usize>(dir: &Path) {
    use cxc_sync::{SeqLock, SeqLockError};
    let pat = |k: u8| -> [u8; N] {
        std::array::from_fn(|i| k.wrapping_mul(31).wrapping_add((i as u8).wrapping_mul(7)) | 1)
    };
    let heap = SeqLock::new(pat(1)).unwrap();
    assert_eq!(heap.read(), pat(1), "N={N}");
    heap.write(pat(2)).unwrap();
    heap.update(|v| v[N - 1] ^= 0x80).unwrap();
    let mut want = pat(2);
    want[N - 1] ^= 0x80;
    assert_eq!(heap.read(), want, "N={N}");

    let path = dir.join(format!("u8x{N}.cell"));
    let cell = SharedCell::create(&path, pat(3)).unwrap();
    let other = SharedCell::<[u8; N]>::open(&path).unwrap();
    assert_eq!(other.load(), pat(3), "N={N}");
    other.store(pat(4)).unwrap();
    cell.update(|v| v[0] ^= 0x40).unwrap();
    let mut want = pat(4);
    want[0] ^= 0x40;
    assert_eq!(other.load(), want, "N={N}");
    let st = SharedCell::<()>::inspect(&path).unwrap();
    let mut words = [0u8; 48];
    words[..N].copy_from_slice(&want);
    let got: Vec<u8> = st
        .value_words
        .iter()
        .flat_map(|w| w.to_ne_bytes())
        .collect();
    assert_eq!(got, words, "N={N}: inspect");
    match SharedCell::<[u8; 49]>::open(&path) {
        Err(SeqLockError::PayloadTooLarge { max: 48, found: 49 }) => {}
        other => panic!("N={N}: 49 bytes: {other:?}"),
    }
    if N < 48 {
        let wider = SharedCell::<[u8; 48]>::open(&path);
        assert!(
            matches!(
                wider,
                Err(SeqLockError::File(cxc_mmf::MmfError::TypeMismatch { .. }))
            ),
            "N={N}: opened as [u8; 48]: {wider:?}"
        );
    }
    if N.is_multiple_of(2) && N >= 2 {
        // The same size, another type.
        let r = match N {
            16 => SharedCell::<[u16; 8]>::open(&path).map(|_| ()),
            48 => SharedCell::<[u64; 6]>::open(&path).map(|_| ()),
            _ => Err(SeqLockError::PayloadAlign { max: 0, found: 0 }),
        };
        assert!(r.is_err(), "N={N}: a [u8; {N}] cell opened as another type");
    }
}

macro_rules! all_sizes {
    ($dir:expr; $($n:literal)*) => { $( sizes_one::<$n>($dir); )* };
}

/// docs/seqlock.md: "A sequence lock for a value `T` of at most 48 bytes"; "`T` ... at
/// most 48 bytes, alignment at most 8"; "Payloads whose size is not a multiple of 8 copy
/// whole words (`⌈size / 8⌉`) and then the `size` bytes of `T` out of them"; errors
/// `PayloadTooLarge (> 48 bytes)`, `PayloadAlign (> 8)`; shared-cell.md: "a cell of
/// another `T` is refused (`TypeMismatch`)". Every size from 1 to 48 bytes round-trips
/// on the heap, in a file and through `inspect` (zero-padded), plus `()`, `[u16; 23]`,
/// `[u32; 11]`, `[u64; 6]` and a 40-byte struct; 49 bytes and `u128` (alignment 16) are
/// refused everywhere; a cell is refused as a wider or same-sized other type.
#[test]
fn every_payload_size_round_trips_and_misfits_are_refused() {
    use cxc_sync::{SeqLock, SeqLockError};
    let d = tempfile::tempdir().unwrap();
    all_sizes!(d.path(); 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26
        27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48);
    let unit = SeqLock::new(()).unwrap();
    unit.write(()).unwrap();
    unit.update(|_| {}).unwrap();
    let c = SharedCell::create(d.path().join("unit"), ()).unwrap();
    c.store(()).unwrap();
    c.load();
    let m = Mixed {
        a: u64::MAX - 3,
        b: [9; 32],
    };
    let c = SharedCell::create(d.path().join("mixed"), m).unwrap();
    c.update(|v| v.b[31] = 1).unwrap();
    assert_eq!(
        c.load(),
        Mixed {
            b: {
                let mut b = [9; 32];
                b[31] = 1;
                b
            },
            ..m
        }
    );
    let c = SharedCell::create(d.path().join("u16"), [7u16; 23]).unwrap();
    c.store([0xFFFF; 23]).unwrap();
    assert_eq!(c.load(), [0xFFFF; 23]);
    let c = SharedCell::create(d.path().join("u32"), [7u32; 11]).unwrap();
    c.update(|v| v[10] = 1).unwrap();
    assert_eq!(c.load()[10], 1);
    assert!(matches!(
        SeqLock::new([0u8; 49]),
        Err(SeqLockError::PayloadTooLarge { max: 48, found: 49 })
    ));
    assert!(matches!(
        SharedCell::create(d.path().join("big"), [0u8; 49]),
        Err(SeqLockError::PayloadTooLarge { .. })
    ));
    assert!(
        !d.path().join("big").exists(),
        "a refused create left a file"
    );
    assert!(matches!(
        SeqLock::new(0u128),
        Err(SeqLockError::PayloadAlign { max: 8, found: 16 })
    ));
    assert!(matches!(
        SharedCell::create(d.path().join("wide"), 0u128),
        Err(SeqLockError::PayloadAlign { .. })
    ));
    assert!(matches!(
        SharedCell::<u128>::open(d.path().join("u32")),
        Err(SeqLockError::PayloadAlign { .. })
    ));
}

/// `[u8; N]` made of the first `N` bytes of `sealed(k)`: a torn copy fails `odd_intact`.
fn odd_value<const N: usize>(k: u64) -> [u8; N] {
    let w = sealed(k);
    std::array::from_fn(|i| w[i / 8].to_ne_bytes()[i % 8])
}

fn odd_intact<const N: usize>(v: &[u8; N]) -> bool {
    let k = u64::from_ne_bytes(v[..8].try_into().unwrap());
    odd_value::<N>(k) == *v
}

fn odd_writer<const N: usize>() {
    let cell = SharedCell::<[u8; N]>::open(path_arg("path")).unwrap();
    let id: u64 = arg("id").parse().unwrap();
    report("ready");
    let mut i = 0u64;
    loop {
        i += 1;
        if i.is_multiple_of(4) {
            let _ = cell.update(|v| *v = odd_value::<N>((id << 40) | i));
        } else {
            cell.store(odd_value::<N>((id << 40) | i)).unwrap();
        }
    }
}

fn odd_reader<const N: usize>() {
    let cell = SharedCell::<[u8; N]>::open(path_arg("path")).unwrap();
    let stop = path_arg("stop");
    report("ready");
    let (mut loads, mut torn) = (0u64, 0u64);
    while !stop.exists() {
        for _ in 0..1000 {
            loads += 1;
            torn += u64::from(!odd_intact(&cell.load()));
        }
    }
    report(format!("loads={loads} torn={torn}"));
}

fn role_odd_writer() {
    match arg("n").as_str() {
        "9" => odd_writer::<9>(),
        "15" => odd_writer::<15>(),
        "47" => odd_writer::<47>(),
        n => panic!("{n}"),
    }
}

fn role_odd_reader() {
    match arg("n").as_str() {
        "9" => odd_reader::<9>(),
        "15" => odd_reader::<15>(),
        "47" => odd_reader::<47>(),
        n => panic!("{n}"),
    }
}

const ODD: &str = "odd_sized_payloads_of_killed_and_stopped_writers_are_never_torn";

/// docs/shared-cell.md: "`load() -> T` never blocks, never torn"; "A writer that is
/// SIGKILLed or SIGSTOPped mid-store never exposes its bytes". Payloads of 9, 15 and 47
/// bytes (a partial last word), stored and updated by three processes that the parent
/// SIGKILLs and SIGSTOPs at random (1.5 s per size), checked by a reader process and the
/// parent (each value is a prefix of a checksummed one).
#[test]
fn odd_sized_payloads_of_killed_and_stopped_writers_are_never_torn() {
    fn run<const N: usize>(rng: &mut cxc_testkit::Rng) -> (u64, u64, u64) {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("odd.cell");
        let stop = d.path().join("stop");
        let cell = SharedCell::create(&path, odd_value::<N>(0)).unwrap();
        let spawn = |id: u64| {
            let mut p = RoleCommand::new(ODD, "odd_writer")
                .arg("path", &path)
                .arg("n", N.to_string())
                .arg("id", id.to_string())
                .spawn();
            p.next_report(REPORT_WAIT);
            p
        };
        let mut reader = RoleCommand::new(ODD, "odd_reader")
            .arg("path", &path)
            .arg("n", N.to_string())
            .arg("stop", &stop)
            .spawn();
        reader.next_report(REPORT_WAIT);
        let mut next = 1u64;
        let mut ws: Vec<Proc> = (0..3)
            .map(|_| {
                next += 1;
                spawn(next)
            })
            .collect();
        let until = Instant::now() + Duration::from_millis(1500);
        let (mut torn, mut events) = (0u64, 0u64);
        while Instant::now() < until {
            let i = rng.below(3) as usize;
            if rng.percent(30) {
                ws[i].kill();
                next += 1;
                ws[i] = spawn(next);
            } else {
                ws[i].stop();
                let pause = Instant::now() + Duration::from_micros(rng.range(500, 20_000));
                while Instant::now() < pause {
                    torn += u64::from(!odd_intact(&cell.load()));
                }
                ws[i].cont();
            }
            events += 1;
            let pause = Instant::now() + Duration::from_micros(rng.range(0, 10_000));
            while Instant::now() < pause {
                torn += u64::from(!odd_intact(&cell.load()));
            }
        }
        for w in &mut ws {
            w.kill();
        }
        std::fs::write(&stop, b"").unwrap();
        let r = reader.finish(CHILD_DEADLINE).pop().unwrap();
        let t = Instant::now();
        cell.store(odd_value::<N>(1 << 50)).unwrap();
        cell.update(|v| *v = odd_value::<N>((1 << 50) + 1)).unwrap();
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(cell.load(), odd_value::<N>((1 << 50) + 1));
        (torn + num(&r, "torn"), num(&r, "loads"), events)
    }
    play_role!(role_odd_writer, role_odd_reader);
    let _s = serial();
    let mut rng = cxc_testkit::Rng::for_test();
    for (n, r) in [
        (9, run::<9>(&mut rng)),
        (15, run::<15>(&mut rng)),
        (47, run::<47>(&mut rng)),
    ] {
        println!(
            "{n} bytes: torn={} reader_loads={} kills/stops={}",
            r.0, r.1, r.2
        );
        assert_eq!(r.0, 0, "{n}-byte payload: torn loads");
        assert!(r.1 > 0);
    }
}

// ---------------------------------------------------------------------------------------
// 7. Re-entrant update closures.
// ---------------------------------------------------------------------------------------

/// docs/seqlock.md (API): "`update` ... atomic read-modify-write; `Err(Superseded)` if
/// another writer published first (result discarded)"; handle docs: "The lane is taken
/// again after `f` (which may itself write through this handle)"; (Update) a waiting
/// updater "takes over a holder that keeps the same claim longer than the stall
/// timeout". A closure that writes through its own handle, one that updates through its
/// own handle, and one that updates through another handle of the same file: the outer
/// update must be refused (its input is stale), the inner write or update must land
/// whole, nothing may hang past the stall timeout, and the claim must be free afterwards.
/// The inner `update` waits for its own outer update for the full stall timeout and is
/// told `Stalled` (printed; not documented either way).
#[test]
fn reentrant_update_closures_publish_once_and_never_hang() {
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("re.cell");
    let mut cell = SharedCell::<[u64; 6]>::create(&path, sealed(0)).unwrap();
    let mut other = SharedCell::<[u64; 6]>::open(&path).unwrap();
    let stall = Duration::from_millis(300);
    cell.set_stall_timeout(stall);
    other.set_stall_timeout(stall);
    // Write inside: at once; the outer update is refused.
    let t = Instant::now();
    let mut inner = None;
    let outer = cell.update(|v| {
        inner = Some(cell.store(sealed(11)));
        *v = sealed(12);
    });
    let took = t.elapsed();
    println!("write inside update: outer {outer:?}, inner {inner:?}, {took:?}");
    assert_eq!(inner, Some(Ok(Written::default())));
    assert_eq!(outer, Err(WriteError::Superseded));
    assert_eq!(cell.load(), sealed(11));
    assert!(took < Duration::from_millis(250), "{took:?}");
    // Update inside, same handle and another handle.
    for (name, h) in [("same handle", &cell), ("other handle", &other)] {
        let before = cell.load();
        let t = Instant::now();
        let mut inner = None;
        let mut inner_took = Duration::ZERO;
        let outer = cell.update(|v| {
            let t2 = Instant::now();
            inner = Some(h.update(|w| *w = upd(w, 21)));
            inner_took = t2.elapsed();
            *v = upd(v, 22);
        });
        let took = t.elapsed();
        println!(
            "update inside update ({name}): outer {outer:?}, inner {inner:?} after {inner_took:?}"
        );
        assert!(
            took < stall + Duration::from_secs(1),
            "{name}: hung for {took:?}"
        );
        let inner = inner.unwrap();
        assert!(inner.is_ok(), "{name}: {inner:?}");
        assert_eq!(outer, Err(WriteError::Superseded), "{name}");
        assert_eq!(
            cell.load(),
            upd(&before, 21),
            "{name}: exactly the inner update"
        );
        let mut probe = SharedCell::<[u64; 6]>::open(&path).unwrap();
        probe.set_stall_timeout(Duration::from_secs(10));
        let t = Instant::now();
        assert_eq!(
            probe.update(|v| *v = upd(v, 23)),
            Ok(Written::default()),
            "{name}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "{name}: claim left held"
        );
    }
}

// ---------------------------------------------------------------------------------------
// 8. Tight loops beside an updater and a reader.
// ---------------------------------------------------------------------------------------

/// Role: updates (`mode=update`) or stores (`mode=store`) in a tight loop until `stop`
/// exists; reports its counts.
fn role_hammer() {
    let cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
    let stop = path_arg("stop");
    let id: u64 = arg("id").parse().unwrap();
    let update = arg("mode") == "update";
    report("ready");
    let (mut ok, mut superseded, mut i) = (0u64, 0u64, 0u64);
    while !stop.exists() {
        for _ in 0..256 {
            i += 1;
            let r = if update {
                cell.update(|v| *v = upd(v, id))
            } else {
                cell.store(sealed((id << 32) | (i & 0xFFFF_FFFF)))
            };
            match r {
                Ok(_) => ok += 1,
                Err(WriteError::Superseded) => superseded += 1,
                Err(e) => panic!("{e}"),
            }
        }
    }
    report(format!("ok={ok} superseded={superseded}"));
}

const TIGHT: &str = "updater_and_reader_beside_tight_loops_make_progress";

/// docs/seqlock.md: "`read` never blocks" (a read retries only when a publication
/// happened during its copy); "The claim makes updaters take turns"; a waiting updater
/// "spins 128 rounds, then asks the OS every 500 µs ... and takes over a holder that keeps
/// the same claim longer than the stall timeout". No fairness is promised: this measures
/// whether an updater can be starved by two processes updating in tight loops (updates
/// for 2 s, each must finish within 2 s, and the sum of `Ok`s must match the counter),
/// and whether a reader can be starved by two processes storing flat out (batches of
/// 1,000 reads for 2 s, each within 2 s).
#[test]
fn updater_and_reader_beside_tight_loops_make_progress() {
    play_role!(role_hammer);
    let _s = serial();
    for mode in ["update", "store"] {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("tight.cell");
        let stop = d.path().join("stop");
        let cell = SharedCell::<[u64; 6]>::create(&path, sealed(0)).unwrap();
        let mut hs: Vec<Proc> = (1..=2u64)
            .map(|id| {
                RoleCommand::new(TIGHT, "hammer")
                    .arg("path", &path)
                    .arg("stop", &stop)
                    .arg("id", id.to_string())
                    .arg("mode", mode)
                    .spawn()
            })
            .collect();
        for h in &mut hs {
            h.next_report(REPORT_WAIT);
        }
        let mut lat = Vec::new();
        let mut my_ok = 0u64;
        let until = Instant::now() + Duration::from_secs(2);
        if mode == "update" {
            while Instant::now() < until || lat.len() < 300 {
                let t = Instant::now();
                my_ok += u64::from(cell.update(|v| *v = upd(v, 9)).is_ok());
                lat.push(t.elapsed());
            }
        } else {
            while Instant::now() < until || lat.len() < 200 {
                let t = Instant::now();
                for _ in 0..1000 {
                    assert!(intact(&cell.load()));
                }
                lat.push(t.elapsed());
            }
        }
        std::fs::write(&stop, b"").unwrap();
        let mut total_ok = my_ok;
        let mut lines = Vec::new();
        for h in &mut hs {
            let l = h.finish(CHILD_DEADLINE).pop().unwrap();
            total_ok += num(&l, "ok");
            lines.push(l);
        }
        lat.sort_unstable();
        let (med, p99, max) = (
            lat[lat.len() / 2],
            lat[lat.len() * 99 / 100],
            lat[lat.len() - 1],
        );
        println!(
            "{mode}: this process median {med:?} p99 {p99:?} max {max:?}; mine ok={my_ok}; \
             hammers {lines:?}; counters {:?}",
            cell.counters()
        );
        assert!(
            max < Duration::from_secs(2),
            "{mode}: starved for {max:?} beside two tight loops"
        );
        if mode == "update" {
            assert_eq!(
                ctr(&cell.load()),
                total_ok & 0xFFFF_FFFF,
                "lost or doubled updates"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// 9. Hostile files.
// ---------------------------------------------------------------------------------------

fn patch(path: &Path, off: usize, v: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&v.to_ne_bytes(), off as u64).unwrap();
}

/// docs/memory-layout.md: "After open, values read from the body (slot indices,
/// counters) are still untrusted"; docs/seqlock.md: "`NoWriterSlot`"; a waiting updater
/// "asks the OS ... whether the holder's process is dead (the identity recorded in the
/// holder's slot)". Words of a live cell patched by another writer of the file: every
/// slot state set to an undefined state (3), then restored; the update claim naming a
/// free slot; the published word set to `u64::MAX` and to a word with bit 63 set. No
/// panic, no hang: typed `NoWriterSlot` while no slot can be had, an update that takes the
/// forged claim at once, loads and writes that carry on whole.
#[test]
fn garbage_slot_claim_and_published_words_give_typed_errors_or_progress() {
    let _s = serial();
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("hostile.cell");
    let mut cell = SharedCell::<[u64; 6]>::create(&path, sealed(1)).unwrap();
    cell.set_stall_timeout(Duration::from_secs(10));
    cell.store(sealed(2)).unwrap();
    // Every slot in an undefined state: a new handle gets no slot, a typed error.
    let saved: Vec<u64> = (0..32)
        .map(|i| cxc_testkit::read_word(&path, (SLOTS_AT + 64 * i) as u64))
        .collect();
    for i in 0..32 {
        patch(&path, SLOTS_AT + 64 * i, 3);
    }
    let fresh = SharedCell::<[u64; 6]>::open(&path).unwrap();
    let t = Instant::now();
    assert_eq!(fresh.store(sealed(3)), Err(WriteError::NoWriterSlot));
    assert_eq!(
        fresh.update(|v| *v = upd(v, 3)),
        Err(WriteError::NoWriterSlot)
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(fresh.load(), sealed(2));
    for (i, s) in saved.iter().enumerate() {
        patch(&path, SLOTS_AT + 64 * i, *s);
    }
    fresh.store(sealed(4)).unwrap();
    assert_eq!(cell.load(), sealed(4));
    // A claim naming a free slot (slot 20 + 1), as if held.
    patch(&path, CLAIM_WORD, (7 << 8) | 21);
    let t = Instant::now();
    let r = cell.update(|v| *v = upd(v, 5));
    println!("forged claim: {r:?} after {:?}", t.elapsed());
    assert!(r.is_ok(), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "waited {:?}",
        t.elapsed()
    );
    assert_eq!(cell.load(), upd(&sealed(4), 5));
    // Published words with the top bits set.
    for bad in [u64::MAX, (1 << 63) | (5 << 8) | 2, (u64::MAX >> 8) << 8] {
        patch(&path, PUB_WORD, bad);
        let v = cell.load();
        let _ = SharedCell::<()>::inspect(&path).unwrap();
        let t = Instant::now();
        cell.store(sealed(6)).unwrap();
        assert_eq!(cell.load(), sealed(6), "after pub_word {bad:#x}");
        fresh.store(sealed(7)).unwrap();
        assert_eq!(cell.load(), sealed(7), "after pub_word {bad:#x}");
        assert!(cell.update(|v| *v = upd(v, 8)).is_ok());
        assert_eq!(cell.load(), upd(&sealed(7), 8));
        assert!(t.elapsed() < Duration::from_secs(1));
        println!(
            "pub_word {bad:#x}: loaded {:#x}, then stores and updates went on",
            v[0]
        );
    }
}

/// Role: maps the cell, reports, waits for `go`, then loads.
fn role_mapped_reader() {
    let cell = SharedCell::<[u64; 6]>::open(path_arg("path")).unwrap();
    report(format!("ready v={:#x}", cell.load()[0]));
    cxc_testkit::child_wait_for_path(&path_arg("go"), Duration::from_secs(30));
    let v = cell.load();
    report(format!("loaded v={:#x} intact={}", v[0], intact(&v)));
}

/// A reader process maps a cell holding `sealed(1)`; the file is truncated to `len`
/// bytes; the reader loads once more. Its exit status and output.
fn truncate_under_a_reader(test: &str, len: u64) -> (std::process::ExitStatus, String) {
    let d = tempfile::tempdir().unwrap();
    let path = d.path().join("trunc.cell");
    let go = d.path().join("go");
    drop(SharedCell::<[u64; 6]>::create(&path, sealed(1)).unwrap());
    let mut r = RoleCommand::new(test, "mapped_reader")
        .arg("path", &path)
        .arg("go", &go)
        .spawn();
    r.next_report(REPORT_WAIT);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len)
        .unwrap();
    std::fs::write(&go, b"").unwrap();
    let st = r.wait_timeout(REPORT_WAIT).expect("the reader ended");
    let o = SharedCell::<[u64; 6]>::open(&path);
    assert!(matches!(o, Err(cxc_sync::SeqLockError::File(_))), "{o:?}");
    assert!(SharedCell::<()>::inspect(&path).is_err());
    (st, r.stdout())
}

const TRUNC: &str = "cell_truncated_to_zero_under_a_mapping_faults_and_is_refused";

/// docs/shared-cell.md (Pitfalls): "The fast paths assume the file is not truncated by
/// another process; a hostile truncation faults the mapping (SIGBUS), as with any mapped
/// file"; memory-layout.md: file length = `TOTAL_LEN` else `WrongLength`. A reader
/// process maps the cell; the file is truncated to 0 bytes: its next load ends it with
/// SIGBUS; `open` and `inspect` are refused with typed errors; an over-long file (one
/// page appended) is refused as `WrongLength`.
#[test]
fn cell_truncated_to_zero_under_a_mapping_faults_and_is_refused() {
    use std::os::unix::process::ExitStatusExt;
    play_role!(role_mapped_reader);
    let _s = serial();
    let (st, out) = truncate_under_a_reader(TRUNC, 0);
    println!("reader after truncation to 0: {st:?}");
    assert_eq!(st.signal(), Some(libc::SIGBUS), "{st:?}: {out}");
    let d = tempfile::tempdir().unwrap();
    let long = d.path().join("long.cell");
    drop(SharedCell::<[u64; 6]>::create(&long, sealed(1)).unwrap());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&long)
        .unwrap()
        .set_len((FILE_LEN + 4096) as u64)
        .unwrap();
    let o = SharedCell::<[u64; 6]>::open(&long);
    assert!(
        matches!(
            o,
            Err(cxc_sync::SeqLockError::File(
                cxc_mmf::MmfError::WrongLength { .. }
            ))
        ),
        "{o:?}"
    );
}
