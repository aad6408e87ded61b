//! [`SidecarBox`]: an instance registered with a sidecar for as long as the box lives.

use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, Weak};

use crate::instance::{AdaptiveInstance, InstanceId};
use crate::policy::Policy;
use crate::sidecar::Sidecar;
use crate::stats::Stats;

/// Owns an [`AdaptiveInstance`], registered with a [`Sidecar`] from [`new`](Self::new)
/// until drop; derefs to the instance.
///
/// Raw `create()`/`open()` of a primitive return the unregistered type, which records its
/// transitions into its file's ring all the same but is not polled by this process's
/// sidecar; wrapping it costs nothing on its operations (the box is a pointer to it).
///
/// Dropping the box unregisters the instance without waiting for a poll in progress, so it
/// may be dropped anywhere, including inside a [`Policy`] callback. If a poll is processing
/// the instance at that moment, the instance itself is dropped when that poll finishes.
///
/// # Examples
/// ```standalone_crate
/// use std::sync::atomic::AtomicU64;
/// use cxc_sidecar::{
///     AdaptiveInstance, AdaptiveSpin, HandshakeHeader, ObservationRing, OpCode, Sidecar,
///     SidecarBox, counter_values,
/// };
/// # struct Demo { ring: ObservationRing, hs: HandshakeHeader, counters: [AtomicU64; 1] }
/// # impl AdaptiveInstance for Demo {
/// #     fn kind(&self) -> cxc_mmf::Kind { cxc_mmf::Kind::Test }
/// #     fn name(&self) -> String { "demo".into() }
/// #     fn ring(&self) -> &ObservationRing { &self.ring }
/// #     fn handshake(&self) -> &HandshakeHeader { &self.hs }
/// #     fn counters(&self) -> Vec<(&'static str, u64)> { counter_values(&["waits"], &self.counters) }
/// # }
/// # let demo = Demo { ring: ObservationRing::new(), hs: HandshakeHeader::new(), counters: [AtomicU64::new(0)] };
/// let boxed = SidecarBox::with_policy(demo, AdaptiveSpin::new());
/// boxed.ring().record(OpCode::LeaseBlockedWait, 0, 1_500); // through Deref
/// let report = Sidecar::global().poll();
/// assert_eq!(report.get(boxed.id()).unwrap().observations.len(), 1);
/// let id = boxed.id();
/// drop(boxed); // unregistered
/// assert!(Sidecar::global().poll().get(id).is_none());
/// ```
pub struct SidecarBox<T: AdaptiveInstance> {
    inner: Arc<T>,
    id: InstanceId,
    sidecar: &'static Sidecar,
}

impl<T: AdaptiveInstance> SidecarBox<T> {
    /// Registers `instance` with the global sidecar, without a policy.
    pub fn new(instance: T) -> Self {
        Self::new_in(Sidecar::global(), instance, None)
    }

    /// Registers `instance` with the global sidecar, with `policy`.
    pub fn with_policy(instance: T, policy: impl Policy) -> Self {
        Self::new_in(Sidecar::global(), instance, Some(Box::new(policy)))
    }

    /// Registers `instance` with `sidecar`.
    pub fn new_in(sidecar: &'static Sidecar, instance: T, policy: Option<Box<dyn Policy>>) -> Self {
        instance.set_observed(true);
        let inner = Arc::new(instance);
        let weak: Weak<dyn AdaptiveInstance> = Arc::downgrade(&inner) as Weak<dyn AdaptiveInstance>;
        let id = sidecar.register(weak, policy);
        SidecarBox { inner, id, sidecar }
    }

    /// The registration id.
    pub fn id(&self) -> InstanceId {
        self.id
    }

    /// The sidecar it is registered with.
    pub fn sidecar(&self) -> &'static Sidecar {
        self.sidecar
    }

    /// Sets (replaces) its policy.
    pub fn set_policy(&self, policy: impl Policy) {
        self.sidecar.set_policy(self.id, Box::new(policy));
    }

    /// Removes its policy.
    pub fn clear_policy(&self) {
        self.sidecar.clear_policy(self.id);
    }

    /// Its stats as of the last poll.
    pub fn stats(&self) -> Stats {
        self.sidecar.stats(self.id).unwrap_or_default()
    }
}

impl<T: AdaptiveInstance> Deref for SidecarBox<T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        &self.inner
    }
}

impl<T: AdaptiveInstance> AsRef<T> for SidecarBox<T> {
    #[inline]
    fn as_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AdaptiveInstance> Drop for SidecarBox<T> {
    fn drop(&mut self) {
        self.sidecar.unregister(self.id);
        self.inner.set_observed(false);
    }
}

impl<T: AdaptiveInstance + fmt::Debug> fmt::Debug for SidecarBox<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SidecarBox")
            .field("id", &self.id)
            .field("inner", &*self.inner)
            .finish()
    }
}
