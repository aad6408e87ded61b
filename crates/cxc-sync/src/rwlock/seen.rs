//! [`Seen`]: what a handle's waiters last saw of the writer they wait behind.

use std::time::{Duration, Instant};

/// How recent the last look must be for a waiter to continue the observation.
const SEEN_FRESH: Duration = Duration::from_millis(100);

/// What a handle's waiters last saw of the writer they wait behind: its claim and
/// progress counter, since when they have not moved, and when a waiter last looked. Kept in
/// the handle, so back-to-back timed waits (e.g. `write_timeout` in slices) add up to the
/// grace like one long wait; a look more than [`SEEN_FRESH`] ago starts over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    id: u64,
    beat: u64,
    since: Instant,
    last: Instant,
}

impl Seen {
    /// Records a look at `now` at the writer with claim id `id` and progress counter
    /// `beat`; `true` if neither has moved for at least `grace` of continued looks.
    pub(crate) fn stalled(
        seen: &mut Option<Seen>,
        id: u64,
        beat: u64,
        now: Instant,
        grace: Duration,
    ) -> bool {
        match *seen {
            Some(s)
                if s.id == id
                    && s.beat == beat
                    && now.saturating_duration_since(s.last) <= SEEN_FRESH =>
            {
                *seen = Some(Seen { last: now, ..s });
                now.duration_since(s.since) >= grace
            }
            _ => {
                *seen = Some(Seen {
                    id,
                    beat,
                    since: now,
                    last: now,
                });
                false
            }
        }
    }
}
