//! Test support: `Probe`, an `AdaptiveInstance` over a `Kind::Test` file whose fixed block
//! embeds counters, a handshake and a ring the way a primitive does, and a private
//! sidecar. Child processes are `cxc_testkit`'s.
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use cxc_mmf::{CreateOptions, Expect, Kind, Layout, Mapped, MmfError, TypeFingerprint};
use zerocopy::{FromBytes, KnownLayout};

use cxc_sidecar::{AdaptiveInstance, HandshakeHeader, ObservationRing, OpCode, counter_values};

cxc_mmf::atomic_layout! {
    /// The probe's fixed block, laid out like a primitive's.
    #[derive(FromBytes, KnownLayout)]
    #[repr(C, align(64))]
    pub struct ProbeState {
        pub counters: [AtomicU64; 16],
        pub handshake: HandshakeHeader,
        pub ring: ObservationRing,
    }
}

const _: () = assert!(size_of::<ProbeState>() == 128 + 64 + 2624);

pub const HEAD_SIZE: u32 = size_of::<ProbeState>() as u32;
/// Counter indices.
pub const EVENTS: usize = 0;
pub const WAITS: usize = 1;
pub const COUNTER_NAMES: [&str; 2] = ["events", "waits"];

/// Marks the probe's files among other test files.
const PROBE_PARAM: u64 = 0x5349_4445; // "SIDE"

fn check_params(p: &[u64; 4]) -> Result<(), MmfError> {
    if p[0] == PROBE_PARAM {
        Ok(())
    } else {
        Err(MmfError::ParamMismatch {
            name: "probe",
            expected: PROBE_PARAM.to_string(),
            found: p[0],
        })
    }
}

pub struct Probe {
    map: Mapped<ProbeState>,
    dropped: Option<Arc<AtomicBool>>,
}

impl Probe {
    pub fn create(path: &Path) -> Probe {
        let layout = Layout {
            kind: Kind::Test,
            head_size: HEAD_SIZE,
            slot_size: 0,
            capacity: 0,
            payload: TypeFingerprint::NONE,
            params: [PROBE_PARAM, 0, 0, 0],
        };
        // No init: an all-zero block is an empty ring and the default handshake.
        let map = Mapped::create(path, layout, &CreateOptions::default(), |_, _| {})
            .expect("create probe file");
        Probe { map, dropped: None }
    }

    pub fn open(path: &Path) -> Probe {
        let expect = Expect {
            kind: Kind::Test,
            head_size: HEAD_SIZE,
            slot_size: 0,
            capacity: Some(0),
            max_capacity: 0,
            payload: TypeFingerprint::NONE,
            check_params: &check_params,
        };
        let map = Mapped::open(path, &expect).expect("open probe file");
        Probe { map, dropped: None }
    }

    /// Sets `flag` when the probe is dropped.
    pub fn with_drop_flag(mut self, flag: Arc<AtomicBool>) -> Probe {
        self.dropped = Some(flag);
        self
    }

    pub fn state(&self) -> &ProbeState {
        self.map.head()
    }

    /// Counts and records an event, as a primitive's slow path does.
    pub fn event(&self, code: u16, flags: u16, arg: u64) -> u64 {
        self.state().counters[EVENTS].fetch_add(1, Ordering::Relaxed);
        self.state().ring.record_code(code, flags, arg)
    }

    /// Records a blocked wait of `ns`.
    pub fn wait(&self, ns: u64, flags: u16) {
        self.state().counters[WAITS].fetch_add(1, Ordering::Relaxed);
        self.event(OpCode::LeaseBlockedWait.code(), flags, ns);
    }

    pub fn path(&self) -> &Path {
        self.map.path()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        if let Some(f) = &self.dropped {
            f.store(true, Ordering::Release);
        }
    }
}

impl AdaptiveInstance for Probe {
    fn kind(&self) -> Kind {
        Kind::Test
    }

    fn name(&self) -> String {
        self.map.path().display().to_string()
    }

    fn ring(&self) -> &ObservationRing {
        &self.state().ring
    }

    fn handshake(&self) -> &HandshakeHeader {
        &self.state().handshake
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        counter_values(&COUNTER_NAMES, &self.state().counters)
    }
}

/// A private sidecar, so tests running in parallel threads do not poll each other.
pub fn private_sidecar() -> &'static cxc_sidecar::Sidecar {
    Box::leak(Box::new(cxc_sidecar::Sidecar::new()))
}
