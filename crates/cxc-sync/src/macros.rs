//! Declarative macros for boilerplate the primitives share: builder setters, the
//! `Instrumented` implementation of a file-backed handle, the loom crash points of a
//! protocol view, and the items compiled outside the loom models only.
// Some are used only by the file-backed API, which the loom models leave out.
#![cfg_attr(cxc_loom, allow(unused_macros))]

/// Builder-style setters on an options struct, one per listed field, each
/// `pub fn FIELD(mut self, FIELD: TYPE) -> Self` documented "Sets [`Struct::FIELD`].".
///
/// Fields may carry their own doc comments instead (`/// ...` before `field: Type`).
macro_rules! setters {
    ($ty:ident { $($(#[doc = $doc:expr])+ $field:ident: $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                $(#[doc = $doc])+
                pub fn $field(mut self, $field: $t) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
    ($ty:ident { $($field:ident: $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($ty), "::", stringify!($field), "`].")]
                pub fn $field(mut self, $field: $t) -> Self {
                    self.$field = $field;
                    self
                }
            )*
        }
    };
}
pub(crate) use setters;

/// Items compiled outside the loom models only (the file-backed API), each given
/// `#[cfg(not(cxc_loom))]`.
macro_rules! not_loom {
    ($($item:item)*) => {
        $(
            #[cfg(not(cxc_loom))]
            $item
        )*
    };
}
pub(crate) use not_loom;

/// `cxc_sidecar::Instrumented` for a file-backed handle with fields `map` (a `Mapped`
/// whose head has `counters`, `handshake` and `ring`) and `observed`: its kind, its
/// file's path as name, and the counter names given.
macro_rules! instrumented {
    ($ty:ident<$g:ident>, $kind:expr, $names:expr) => {
        $crate::macros::instrumented!(@impl [$g] $ty<$g>, $kind, $names);
    };
    ($ty:ident, $kind:expr, $names:expr) => {
        $crate::macros::instrumented!(@impl [] $ty, $kind, $names);
    };
    (@impl [$($g:ident)?] $ty:ty, $kind:expr, $names:expr) => {
        impl$(<$g>)? cxc_sidecar::Instrumented for $ty {
            fn kind(&self) -> cxc_mmf::Kind {
                $kind
            }

            fn name(&self) -> String {
                self.map.path().display().to_string()
            }

            fn instruments(&self) -> cxc_sidecar::Instruments<'_> {
                let head = self.map.head();
                cxc_sidecar::Instruments {
                    observed: &self.observed,
                    counters: &head.counters,
                    counter_names: $names,
                    handshake: &head.handshake,
                    ring: &head.ring,
                }
            }
        }
    };
}
pub(crate) use instrumented;

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

/// A module of event-counter indices: one `const NAME: usize` per counter, numbered from
/// 0 in the order given (with its doc comment), and `NAMES`, the counters' names by
/// index. With `[N]` after the module name, the file has room for `N` counters: `COUNT`
/// is `N`, `NAMES` has `N` entries (`""` for the unused ones) and `IN_USE` says how many
/// are used; without it, `NAMES` has exactly the counters in use.
///
/// Each counter is written `NAME = field`: `field` is its name in `NAMES` and its field
/// in the typed snapshot `struct Stats` that may follow the module: a `u64` per counter,
/// with the counter's doc comment, and `Stats::read(counters)`.
macro_rules! counters {
    (@stats $module:ident [$($body:tt)*]) => {};
    (
        @stats $module:ident [$($(#[$doc:meta])* $name:ident = $field:ident,)*]
        $(#[$sm:meta])*
        $svis:vis struct $stats:ident;
    ) => {
        $(#[$sm])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
        #[non_exhaustive]
        $svis struct $stats {
            $($(#[$doc])* pub $field: u64,)*
        }

        impl $stats {
            /// The values of the file's `counters` (Relaxed loads, one at a time).
            #[allow(dead_code)]
            pub(crate) fn read(counters: &[$crate::primitive::AtomicU64]) -> Self {
                let get = |i: usize| {
                    counters
                        .get(i)
                        .map_or(0, |c| c.load($crate::primitive::Ordering::Relaxed))
                };
                $stats {
                    $($field: get($module::$name),)*
                }
            }
        }
    };
    (@names $vis:vis [$($text:expr),*]) => {
        /// Number of counters in use.
        $vis const COUNT: usize = [$($text),*].len();
        /// Names of the counters in use, by index.
        $vis const NAMES: [&str; COUNT] = [$($text),*];
    };
    (@names $vis:vis [$($text:expr),*] $count:expr) => {
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
    (
        $(#[$m:meta])*
        $vis:vis mod $module:ident $([$count:expr])? {
            $($(#[$doc:meta])* $name:ident = $field:ident,)*
        }
        $($stats:tt)*
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
            $crate::macros::counters!(@names $vis [$(stringify!($field)),*] $($count)?);
        }
        $crate::macros::counters!(@stats $module [$($(#[$doc])* $name = $field,)*] $($stats)*);
    };
}
pub(crate) use counters;

/// The `#[repr(C)]` structs of a file's fixed block and slots, declared with
/// `cxc_mmf::atomic_layout!`: outside loom they derive zerocopy's `FromBytes` and
/// `KnownLayout` and are `AtomicView`s (every field checked to be one); in the loom
/// models their fields are loom's atomics and they live on the heap.
///
/// Cache-line alignment and padding are written out (`align(64)`, `_reserved` fields)
/// rather than taken from `crossbeam_utils::CachePadded`: these structs are a file
/// format, and `CachePadded`'s size and alignment depend on the platform (128 bytes on
/// x86_64), so it would change the bytes of the file.
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
