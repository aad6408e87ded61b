//! Loom-only stand-ins: a "process" that dies between two steps, and a futex with real
//! futex semantics (the crate's futex shim only yields under loom, which would hide a
//! lost wake-up).

use crate::primitive::Ordering;

/// Loom only: a "process" that dies at its `at`-th crash point (counted from 0 over every
/// transition it runs) and does nothing afterwards, modelling SIGKILL between two steps.
pub(crate) struct CrashPlan {
    pub(crate) at: u32,
    pub(crate) passed: std::cell::Cell<u32>,
    pub(crate) stopped: std::cell::Cell<bool>,
}

impl CrashPlan {
    pub(crate) fn new(at: u32) -> Self {
        CrashPlan {
            at,
            passed: std::cell::Cell::new(0),
            stopped: std::cell::Cell::new(false),
        }
    }

    pub(crate) fn step(&self) -> bool {
        if !self.stopped.get() {
            let n = self.passed.get();
            self.passed.set(n + 1);
            if n >= self.at {
                self.stopped.set(true);
            }
        }
        self.stopped.get()
    }
}

/// Loom only: the futex with real semantics, shared with the lease (see `park.rs`).
pub(crate) use crate::park::ModelFutex;
