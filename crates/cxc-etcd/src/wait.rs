//! Blocking waits for a key (or a prefix) to be deleted, on an etcd watch.

use std::time::Duration;

use etcd_client::{WatchFilterType, WatchOptions};

use crate::conn::Etcd;

/// The longest single wait: a blocked claimant re-tries at least this often even if no
/// event arrives (a belt-and-braces bound; events are not expected to be lost).
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(1);
/// Pause after a failed watch (e.g. the server is restarting) before the caller retries.
const RETRY: Duration = Duration::from_millis(50);

/// Blocks until a key at `key` (under it, with `prefix`) is deleted at revision `from`
/// or later, or `max` passes, or the watch fails. Returns nothing: the caller re-tries
/// its claim in every case, so a spurious return only costs one round trip.
pub(crate) fn wait_for_delete(etcd: &Etcd, key: &[u8], prefix: bool, from: i64, max: Duration) {
    let mut watch = etcd.client().watch_client();
    let key = key.to_vec();
    etcd.block_on(async move {
        let waited = tokio::time::timeout(max, async move {
            let mut opts = WatchOptions::new()
                .with_start_revision(from)
                .with_filters([WatchFilterType::NoPut]);
            if prefix {
                opts = opts.with_prefix();
            }
            let Ok(mut stream) = watch.watch(key, Some(opts)).await else {
                tokio::time::sleep(RETRY).await;
                return;
            };
            loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        if !resp.events().is_empty()
                            || resp.canceled()
                            || resp.compact_revision() != 0
                        {
                            return;
                        }
                    }
                    Ok(None) | Err(_) => {
                        tokio::time::sleep(RETRY).await;
                        return;
                    }
                }
            }
        });
        let _ = waited.await;
    });
}
