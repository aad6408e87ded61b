//! `cxc create lease|sem|heartbeat|cell|rwlock PATH [options]`.

use std::path::PathBuf;
use std::time::Duration;

use cxc::{EpochMode, OwnerLease, Preemption};

use crate::{CliError, duration, files};

/// What to create.
#[derive(clap::Subcommand, Debug)]
pub(crate) enum CreateKind {
    /// An `OwnerLease<u64>` file, the same file `lease run` creates when one is missing:
    /// no preemption, clock epochs (payload: a run counter and the running command's
    /// process group).
    Lease {
        /// The new file.
        path: PathBuf,
        /// Epoch length of the clock epochs.
        #[arg(long, default_value = "1ms", value_parser = duration::parse)]
        tick: Duration,
        /// Manual epochs instead (a stale holder is then never replaced by age alone).
        #[arg(long)]
        manual_epochs: bool,
        /// Let a lower pid preempt a live holder (the seed API's policy; `lease run`
        /// never wants it).
        #[arg(long)]
        preempt_lower_pid: bool,
        /// No preemption (the default; accepted for old scripts).
        #[arg(long, hide = true)]
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
        /// Holder-table slots (default: one per permit, at least 64, at most the format's
        /// limit), so every holder's permits come back if it dies.
        #[arg(long)]
        holders: Option<u32>,
        /// File permission bits, octal.
        #[arg(long, default_value = "600", value_parser = parse_mode)]
        mode: u32,
    },
    /// A SharedCell file holding 48 raw bytes (the cells `inspect` decodes).
    Cell {
        /// The new file.
        path: PathBuf,
        /// The initial value in hex (at most 48 bytes; zero-padded). Default all zero.
        #[arg(long, value_parser = parse_hex)]
        value: Option<cxc_cli::CellBytes>,
    },
    /// A `SharedRwLock<u64>` file, the same file `rwlock run` creates when one is missing.
    Rwlock(crate::rwlock_run::CreateRwLock),
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

fn parse_hex(s: &str) -> Result<cxc_cli::CellBytes, String> {
    let mut out = [0u8; cxc_cli::CELL_BYTES];
    let digits = s.strip_prefix("0x").unwrap_or(s).as_bytes();
    if !digits.len().is_multiple_of(2) || digits.len() / 2 > out.len() {
        return Err(format!(
            "`{s}`: expected an even number of hex digits, at most {} bytes",
            out.len()
        ));
    }
    for (o, pair) in out.iter_mut().zip(digits.chunks(2)) {
        let text = std::str::from_utf8(pair).map_err(|_| format!("`{s}` is not hex"))?;
        *o = u8::from_str_radix(text, 16).map_err(|_| format!("`{s}` is not hex"))?;
    }
    Ok(out)
}

pub(crate) fn run(what: CreateKind) -> Result<(), CliError> {
    match what {
        CreateKind::Lease {
            path,
            tick,
            manual_epochs,
            preempt_lower_pid,
            no_preempt: _,
            mode,
        } => {
            let builder = OwnerLease::builder(&path)
                .preemption(if preempt_lower_pid {
                    Preemption::LowerPid
                } else {
                    Preemption::Never
                })
                .epoch(if manual_epochs {
                    EpochMode::Manual
                } else {
                    EpochMode::Clock { tick }
                })
                .mode(mode);
            builder
                .create::<u64>(0)
                .map_err(|e| files::error(&path, &e))?;
            cxc_cli::report!("created lease {}", path.display());
            Ok(())
        }
        CreateKind::Sem {
            path,
            permits,
            initial,
            holders,
            mode,
        } => {
            let opts = cxc::SemaphoreOptions::default()
                .mode(mode)
                .holders(crate::sem_run::holders_for(permits, holders)?);
            cxc::SharedSemaphore::create_with(&path, initial.unwrap_or(permits), permits, &opts)
                .map_err(|e| files::error(&path, &e))?;
            cxc_cli::report!("created semaphore {} ({permits} permits)", path.display());
            Ok(())
        }
        CreateKind::Cell { path, value } => {
            cxc::SharedCell::create(&path, value.unwrap_or([0; cxc_cli::CELL_BYTES]))
                .map_err(|e| files::error(&path, &e))?;
            cxc_cli::report!(
                "created cell {} ({} bytes)",
                path.display(),
                cxc_cli::CELL_BYTES
            );
            Ok(())
        }
        CreateKind::Rwlock(args) => crate::rwlock_run::create(args),
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
            cxc::HeartbeatTable::create_with(&path, capacity, &opts)
                .map_err(|e| files::error(&path, &e))?;
            cxc_cli::report!(
                "created heartbeat table {} ({capacity} slots)",
                path.display()
            );
            Ok(())
        }
    }
}
