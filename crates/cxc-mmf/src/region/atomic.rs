//! [`AtomicView`]: the types a mapping may hand out references to, and
//! [`atomic_layout!`](crate::atomic_layout), the one way a `#[repr(C)]` struct becomes one.

use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64};

use zerocopy::{FromBytes, FromZeros, KnownLayout};

/// A type that may be viewed in a mapping that other processes write: every byte of it
/// that Rust code can read is inside an atomic, every bit pattern is valid, its layout is
/// known to the compiler, and it is shareable between threads.
///
/// Implemented for `AtomicU8`, `AtomicU16`, `AtomicU32`, `AtomicU64`, arrays of views and
/// `()`, and for the structs declared with [`atomic_layout!`](crate::atomic_layout), which
/// checks at compile time that every field is itself a view. Plain data is refused, so
/// safe code cannot get a `&u64` into memory another process writes (a data race):
///
/// ```compile_fail
/// fn head(m: &cxc_mmf::Mapped<u64>) -> &u64 {
///     m.head()
/// }
/// ```
///
/// The zerocopy bounds (`FromZeros`, `FromBytes`, `KnownLayout`, which a struct derives)
/// let the compiler check the bit-pattern and layout half; the field check of
/// `atomic_layout!` the "only atomics" half. The alignment of a view must not exceed 64
/// (checked when the mapping is made).
///
/// # Safety
/// Every byte of `Self` that is not padding lies inside an atomic integer, so shared
/// references to it may be used while other threads and processes write it. Do not
/// implement this by hand: declare the struct with `atomic_layout!`.
pub unsafe trait AtomicView: FromZeros + FromBytes + KnownLayout + Sync + Sized {}

macro_rules! atomic_views {
    ($($t:ty),*) => {$(
        // SAFETY: an atomic integer: all its bytes are the atomic; every bit pattern is a
        // valid value (zerocopy's `FromBytes`); it is `Sync`.
        unsafe impl AtomicView for $t {}
    )*};
}
atomic_views!(AtomicU8, AtomicU16, AtomicU32, AtomicU64);

// SAFETY: an array has no bytes but its elements' (no padding between elements), each a
// view.
unsafe impl<T: AtomicView, const N: usize> AtomicView for [T; N] {}

// SAFETY: `()` has no bytes.
unsafe impl AtomicView for () {}

/// Declares `#[repr(C)]` structs of views and makes each an [`AtomicView`], refusing any
/// field whose type is not itself a view.
///
/// Each struct is written as usual, with its attributes (derive zerocopy's `FromBytes`
/// and `KnownLayout`: the trait requires them) and named fields; no generics. An optional
/// leading `#![view_if(PREDICATE)]` compiles the `AtomicView` implementations only under
/// `cfg(PREDICATE)` (for builds where the fields are other atomics, such as a model
/// checker's, and the structs are not mapped).
///
/// A layout is a file format: pad it with explicit reserved fields and `align`, not with
/// `crossbeam_utils::CachePadded`, whose size and alignment differ between platforms.
///
/// ```
/// use std::sync::atomic::{AtomicU32, AtomicU64};
///
/// cxc_mmf::atomic_layout! {
///     /// A fixed block.
///     #[derive(zerocopy::FromBytes, zerocopy::KnownLayout)]
///     #[repr(C, align(64))]
///     pub struct Head {
///         pub count: AtomicU64,
///         pub wake: AtomicU32,
///         reserved: [AtomicU32; 13],
///     }
/// }
/// fn head(m: &cxc_mmf::Mapped<Head>) -> &AtomicU64 {
///     &m.head().count
/// }
/// ```
///
/// A plain field is refused:
///
/// ```compile_fail
/// use std::sync::atomic::AtomicU64;
///
/// cxc_mmf::atomic_layout! {
///     #[derive(zerocopy::FromBytes, zerocopy::KnownLayout)]
///     #[repr(C)]
///     pub struct Head {
///         pub count: AtomicU64,
///         pub plain: u64,
///     }
/// }
/// ```
#[macro_export]
macro_rules! atomic_layout {
    (@each $cfg:tt) => {};
    (
        @each $cfg:tt
        $(#[$attr:meta])*
        $vis:vis struct $name:ident {
            $($(#[$fattr:meta])* $fvis:vis $field:ident : $ty:ty),* $(,)?
        }
        $($rest:tt)*
    ) => {
        $(#[$attr])*
        $vis struct $name {
            $($(#[$fattr])* $fvis $field : $ty),*
        }

        #[cfg $cfg]
        const _: () = {
            /// One field per field of the struct (the same `cfg`s apply), each of a type
            /// that is well-formed only if the field's type is an `AtomicView`.
            #[allow(dead_code)]
            struct FieldsAreViews {
                $($(#[$fattr])* $field: $crate::__private::IsView<$ty>),*
            }
        };

        #[cfg $cfg]
        // SAFETY: the fields checked above are all the fields of the struct (the macro
        // declares both from the same list, under the same `cfg`s), and each check makes
        // the compiler refuse a field whose type is not an `AtomicView`; so every
        // non-padding byte lies inside an atomic. The supertraits (`FromBytes`,
        // `KnownLayout`, `Sync`) are checked as for any implementation.
        unsafe impl $crate::AtomicView for $name {}

        $crate::atomic_layout!(@each $cfg $($rest)*);
    };
    (#![view_if $cfg:tt] $($rest:tt)*) => {
        $crate::atomic_layout!(@each $cfg $($rest)*);
    };
    ($($rest:tt)*) => {
        $crate::atomic_layout!(@each (all()) $($rest)*);
    };
}

/// Support of [`atomic_layout!`](crate::atomic_layout); not part of the API.
#[doc(hidden)]
pub mod __private {
    /// Well-formed only for an [`AtomicView`](super::AtomicView) `T`.
    #[allow(missing_debug_implementations)]
    pub struct IsView<T: super::AtomicView>(std::marker::PhantomData<T>);
}
