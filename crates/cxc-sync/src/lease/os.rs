//! The process-identity functions the lease uses (`cxc_mmf::identity`).

pub(crate) use cxc_mmf::identity::{Identity, Liveness, PidWatch, liveness};

/// Liveness of `id` through a pidfd cached across calls (one `poll` per check once open;
/// reopened when the identity changes). Used by blocked acquirers, which ask repeatedly.
#[derive(Debug, Default)]
pub(crate) struct CachedWatch {
    cur: Option<(Identity, Option<PidWatch>)>,
}

impl CachedWatch {
    pub(crate) fn liveness(&mut self, id: &Identity) -> Liveness {
        if self.cur.as_ref().is_none_or(|(c, _)| c != id) {
            self.cur = Some((*id, PidWatch::open(id)));
        }
        match &self.cur {
            Some((_, Some(w))) => {
                if w.is_dead() {
                    Liveness::Dead
                } else {
                    Liveness::Alive
                }
            }
            // Could not open a pidfd: ask the identity module directly.
            _ => liveness(id),
        }
    }
}
