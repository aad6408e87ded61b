//! `cxc create lease|sem|heartbeat PATH [options]`.

use std::path::PathBuf;
use std::time::Duration;

use cxc::{EpochMode, LeaseOptions, OwnerLease, Preemption};

use crate::{CliError, duration};

/// What to create.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum CreateKind {
    /// An OwnerLease<u64> file (payload: a run counter).
    Lease {
        /// The new file.
        path: PathBuf,
        /// Clock-driven epochs of this length (default: manual epochs).
        #[arg(long, value_parser = duration::parse)]
        tick: Option<Duration>,
        /// Never let a lower pid preempt a live holder.
        #[arg(long)]
        no_preempt: bool,
        /// File permission bits, octal.
        #[arg(long, default_value = "600", value_parser = parse_mode)]
        mode: u32,
    },
    /// A SharedSemaphore file.
    Sem {
        /// The new file.
        path: PathBuf,
        /// Maximum permits.
        #[arg(long)]
        permits: u32,
        /// Permits available at first (default: all).
        #[arg(long)]
        initial: Option<u32>,
        /// File permission bits, octal.
        #[arg(long, default_value = "600", value_parser = parse_mode)]
        mode: u32,
    },
    /// A HeartbeatTable file.
    Heartbeat {
        /// The new file.
        path: PathBuf,
        /// Number of worker slots.
        #[arg(long, default_value_t = 64)]
        capacity: usize,
        /// Clock-driven epochs of this length (default: manual epochs).
        #[arg(long, value_parser = duration::parse)]
        tick: Option<Duration>,
        /// File permission bits, octal.
        #[arg(long, default_value = "600", value_parser = parse_mode)]
        mode: u32,
    },
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("`{s}` is not an octal file mode"))
}

pub(crate) fn run(what: CreateKind) -> Result<(), CliError> {
    match what {
        CreateKind::Lease {
            path,
            tick,
            no_preempt,
            mode,
        } => {
            let opts = LeaseOptions {
                preemption: if no_preempt {
                    Preemption::Never
                } else {
                    Preemption::LowerPid
                },
                epoch: tick.map_or(EpochMode::Manual, |tick| EpochMode::Clock { tick }),
                mode,
                ..LeaseOptions::default()
            };
            OwnerLease::<u64>::create_with(&path, 0, &opts)?;
            println!("created lease {}", path.display());
            Ok(())
        }
        CreateKind::Sem {
            path,
            permits,
            initial,
            mode,
        } => {
            let opts = cxc::SemaphoreOptions::default().mode(mode);
            cxc::SharedSemaphore::create_with(&path, initial.unwrap_or(permits), permits, &opts)?;
            println!("created semaphore {} ({permits} permits)", path.display());
            Ok(())
        }
        CreateKind::Heartbeat {
            path,
            capacity,
            tick,
            mode,
        } => {
            let opts = cxc::HeartbeatOptions {
                epoch: tick.map_or(EpochMode::Manual, |tick| EpochMode::Clock { tick }),
                mode,
            };
            cxc::HeartbeatTable::create_with(&path, capacity, &opts)?;
            println!(
                "created heartbeat table {} ({capacity} slots)",
                path.display()
            );
            Ok(())
        }
    }
}
