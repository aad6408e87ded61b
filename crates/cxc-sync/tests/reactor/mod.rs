//! What the async tests share: one test at a time on the process-wide reactor, and the
//! tokio runtime they run on.
#![allow(dead_code, unreachable_pub)]

/// The reactor is process-wide: tests that count its waiters or the process's CPU run
/// one at a time.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static M: std::sync::Mutex<()> = std::sync::Mutex::new(());
    M.lock().unwrap_or_else(|e| e.into_inner())
}

/// A multi-threaded tokio runtime of two workers, with timers.
pub fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}
