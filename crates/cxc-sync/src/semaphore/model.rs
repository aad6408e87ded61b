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

/// Loom only: futex semantics (compare-and-sleep atomic with respect to wake; a wake
/// reaches at most `n` of the threads asleep at that moment and is lost if none is; no
/// spurious wake-ups) built from a loom mutex and condvar.
pub(crate) struct ModelFutex {
    /// `(asleep, tokens)`: threads asleep, wake-ups handed to them but not yet taken.
    state: loom::sync::Mutex<(u32, u32)>,
    cv: loom::sync::Condvar,
}

impl ModelFutex {
    pub(crate) fn new() -> Self {
        ModelFutex {
            state: loom::sync::Mutex::new((0, 0)),
            cv: loom::sync::Condvar::new(),
        }
    }

    /// Sleeps while `word == expected` until woken.
    pub(crate) fn wait(&self, word: &crate::primitive::AtomicU32, expected: u32) {
        let mut st = self.state.lock().unwrap();
        if word.load(Ordering::SeqCst) != expected {
            return;
        }
        st.0 += 1;
        while st.1 == 0 {
            st = self.cv.wait(st).unwrap();
        }
        st.1 -= 1;
        st.0 -= 1;
    }

    pub(crate) fn wake(&self, n: u32) {
        let mut st = self.state.lock().unwrap();
        let unwoken = st.0 - st.1;
        st.1 += n.min(unwoken);
        self.cv.notify_all();
    }
}
