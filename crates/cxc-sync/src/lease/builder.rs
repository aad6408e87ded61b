//! [`LeaseBuilder`]: the lease's settings fixed once, with the defaults a new user wants.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cxc_mmf::Origin;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::claim::{DEFAULT_GRACE_EPOCHS, GuardSettings, LeaseError, LeaseOptions, Preemption};
use super::file::OwnerLease;
use crate::epoch::EpochMode;

/// Default grace of a builder-made handle.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(1);
/// Default epoch tick of a builder-made file.
pub const DEFAULT_TICK: Duration = Duration::from_millis(1);
/// Builds an [`OwnerLease`] with its settings fixed once: the grace (a `Duration`), the
/// preemption policy, the epoch source, the file mode, and the identity its guards claim
/// as.
///
/// The builder's defaults are what a new user wants, and differ from the seed
/// constructors' ([`OwnerLease::create`] / [`OwnerLease::open`]):
///
/// | setting | builder default | seed constructors |
/// |---|---|---|
/// | preemption | [`Preemption::Never`]: a live holder keeps the lease | [`Preemption::LowerPid`] |
/// | epochs | clock, 1 ms ticks: a hung holder is replaced after the grace with no ticker | manual (`tick_epoch`) |
/// | grace of the guards | 1 s | 3 epochs |
/// | identity of the guards | this process | this process |
///
/// Preemption and the epoch source are stored in the file at creation; opening an
/// existing file keeps the file's.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use cxc_sync::OwnerLease;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = tempfile::tempdir()?;
/// let lease: OwnerLease<u64> = OwnerLease::builder(dir.path().join("jobs.lease"))
///     .grace(Duration::from_millis(500))
///     .create(0)?;
/// let guard = lease.lock();
/// guard.update(|v| *v += 1)?;
/// assert_eq!(guard.read()?, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct LeaseBuilder {
    path: PathBuf,
    grace: Duration,
    grace_epochs: Option<u64>,
    preemption: Preemption,
    epoch: EpochMode,
    mode: u32,
    init_timeout: Duration,
    pid: u32,
}

crate::macros::setters!(LeaseBuilder {
    /// How long a holder's heartbeat may be silent before a guard of this handle takes
    /// the lease over (rounded up to whole epochs of a clock-epoch file).
    grace: Duration,
    /// Who may take the lease from a live holder (stored in the file at creation).
    preemption: Preemption,
    /// The epoch source (stored in the file at creation).
    epoch: EpochMode,
    /// Permission bits of a created file.
    mode: u32,
    /// How long `create_or_open` waits for another process's initialisation.
    init_timeout: Duration,
    /// The pid the guards' claims are made for (shown as the owner; default: this
    /// process's). The claims always name this process's identity.
    pid: u32,
});

impl LeaseBuilder {
    /// A builder for the lease file at `path`, with the defaults above.
    pub fn new(path: impl AsRef<Path>) -> Self {
        LeaseBuilder {
            path: path.as_ref().to_path_buf(),
            grace: DEFAULT_GRACE,
            grace_epochs: None,
            preemption: Preemption::Never,
            epoch: EpochMode::Clock { tick: DEFAULT_TICK },
            mode: 0o600,
            init_timeout: Duration::from_secs(2),
            pid: 0,
        }
    }


    /// The grace in epochs, for files with manual epochs (overrides [`grace`](Self::grace)).
    pub fn grace_epochs(mut self, epochs: u64) -> Self {
        self.grace_epochs = Some(epochs);
        self
    }






    fn options(&self) -> LeaseOptions {
        LeaseOptions {
            preemption: self.preemption,
            epoch: self.epoch,
            mode: self.mode,
            init_timeout: self.init_timeout,
        }
    }

    fn finish<T: FromBytes + IntoBytes + Immutable + KnownLayout>(
        &self,
        mut lease: OwnerLease<T>,
    ) -> Result<OwnerLease<T>, LeaseError> {
        let grace = match (self.grace_epochs, lease.epoch_mode()) {
            (Some(e), _) => e,
            (None, EpochMode::Clock { tick }) => {
                let n = self.grace.as_nanos().div_ceil(tick.as_nanos().max(1));
                u64::try_from(n).map_err(|_| {
                    LeaseError::InvalidOption(format!("grace {:?} is too long", self.grace))
                })?
            }
            (None, EpochMode::Manual) => DEFAULT_GRACE_EPOCHS,
        };
        lease.guard = GuardSettings {
            grace,
            pid: self.pid,
        };
        Ok(lease)
    }

    /// Creates the file holding `initial` (fails if anything exists at the path).
    ///
    /// # Errors
    /// As [`OwnerLease::create_with`].
    pub fn create<T: FromBytes + IntoBytes + Immutable + KnownLayout>(
        &self,
        initial: T,
    ) -> Result<OwnerLease<T>, LeaseError> {
        self.finish(OwnerLease::create_with(
            &self.path,
            initial,
            &self.options(),
        )?)
    }

    /// Opens an existing file (its stored preemption and epochs apply).
    ///
    /// # Errors
    /// As [`OwnerLease::open`].
    pub fn open<T: FromBytes + IntoBytes + Immutable + KnownLayout>(
        &self,
    ) -> Result<OwnerLease<T>, LeaseError> {
        self.finish(OwnerLease::open(&self.path)?)
    }

    /// Creates the file, or opens it if another process created it first.
    ///
    /// # Errors
    /// As [`OwnerLease::create_or_open`].
    pub fn create_or_open<T: FromBytes + IntoBytes + Immutable + KnownLayout>(
        &self,
        initial: T,
    ) -> Result<(OwnerLease<T>, Origin), LeaseError> {
        let (lease, origin) = OwnerLease::create_or_open(&self.path, initial, &self.options())?;
        Ok((self.finish(lease)?, origin))
    }
}

impl OwnerLease<()> {
    /// A [`LeaseBuilder`] for the file at `path` (the payload type is chosen by
    /// `create`/`open`).
    pub fn builder(path: impl AsRef<Path>) -> LeaseBuilder {
        LeaseBuilder::new(path)
    }
}
