//! Declarative macros for boilerplate the primitives share: the declarations of a file's
//! structs and of its event counters, the loom crash points of a protocol view.

/// A module of event-counter indices: one `const NAME: usize` per counter, numbered from
/// 0 in the order given (with its doc comment), and `NAMES`, the counters' names by
/// index. With `[N]` after the module name, the file has room for `N` counters: `COUNT`
/// is `N`, `NAMES` has `N` entries (`""` for the unused ones) and `IN_USE` says how many
/// are used; without it, `NAMES` has exactly the counters in use.
macro_rules! counters {
    (
        $(#[$m:meta])*
        $vis:vis mod $module:ident $([$count:expr])? {
            $($(#[$doc:meta])* $name:ident = $text:literal,)*
        }
    ) => {
        $(#[$m])*
        $vis mod $module {
            #[allow(dead_code, non_camel_case_types, clippy::upper_case_acronyms)]
            #[repr(usize)]
            enum Index {
                $($name,)*
            }
            $(
                $(#[$doc])*
                $vis const $name: usize = Index::$name as usize;
            )*
            $crate::macros::counters!(@names $vis [$($text),*] $($count)?);
        }
    };
    (@names $vis:vis [$($text:literal),*]) => {
        /// Names of the counters in use, by index.
        $vis const NAMES: [&str; [$($text),*].len()] = [$($text),*];
    };
    (@names $vis:vis [$($text:literal),*] $count:expr) => {
        /// Number of counters the file has room for.
        $vis const COUNT: usize = $count;
        /// Number of counters in use (the first `IN_USE` of `COUNT`).
        $vis const IN_USE: usize = [$($text),*].len();
        /// Names of the counters, by index (empty for unused indices).
        $vis const NAMES: [&str; COUNT] = {
            let used = [$($text),*];
            let mut all = [""; COUNT];
            let mut i = 0;
            while i < used.len() {
                all[i] = used[i];
                i += 1;
            }
            all
        };
    };
}
pub(crate) use counters;

/// The `#[repr(C)]` structs of a file's fixed block and slots, declared with
/// `cxc_mmf::atomic_layout!`: outside loom they derive zerocopy's `FromBytes` and
/// `KnownLayout` and are `AtomicView`s (every field checked to be one); in the loom
/// models their fields are loom's atomics and they live on the heap.
macro_rules! file_layout {
    ($($(#[$attr:meta])* $vis:vis struct $name:ident $body:tt)*) => {
        cxc_mmf::atomic_layout! {
            #![view_if(not(cxc_loom))]
            $(
                #[cfg_attr(not(cxc_loom), derive(zerocopy::FromBytes, zerocopy::KnownLayout))]
                $(#[$attr])*
                $vis struct $name $body
            )*
        }
    };
}
pub(crate) use file_layout;

/// The loom crash points of a protocol view (a type with a field
/// `crash: Option<&CrashPlan>` under loom), as methods: `crash_here` (`true` once this
/// "process" has died at a crash point) and `stopped` (whether it has died). Outside loom
/// both are `false` and compile away.
macro_rules! crash_points {
    () => {
        /// Loom crash point: `true` once this "process" has died (never outside loom).
        #[cfg(not(cxc_loom))]
        #[inline(always)]
        pub(crate) fn crash_here(&self) -> bool {
            false
        }

        /// Whether this "process" has died (never outside loom).
        #[cfg(not(cxc_loom))]
        #[inline(always)]
        #[allow(dead_code)]
        pub(crate) fn stopped(&self) -> bool {
            false
        }

        /// Loom crash point: `true` once this "process" has died.
        #[cfg(cxc_loom)]
        pub(crate) fn crash_here(&self) -> bool {
            self.crash
                .is_some_and(crate::semaphore::model::CrashPlan::step)
        }

        /// Whether this "process" has died.
        #[cfg(cxc_loom)]
        pub(crate) fn stopped(&self) -> bool {
            self.crash.is_some_and(|p| p.stopped.get())
        }
    };
}
pub(crate) use crash_points;
