//! [`EtcdFencedKey`]: a [`FencedResource`] in etcd, the storage side of the fencing
//! tokens of [`EtcdElection`](crate::EtcdElection) terms (and of any other token).

use cxc_sync::election::FencedResource;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::conn::{Etcd, key_str};
use crate::error::EtcdError;
use crate::txn::{check_name, nth_get};

/// A [`FencedResource`] in etcd: the data at key `R`, the high-water mark at `R.fence`
/// (decimal). A write reads both, refuses an older token, and commits with a
/// transaction that compares both keys' mod revisions (retrying if another writer came
/// between), so check and write are one step on the server.
#[derive(Debug, Clone)]
pub struct EtcdFencedKey {
    etcd: Etcd,
    data: Vec<u8>,
    fence: Vec<u8>,
}

struct Loaded {
    mark: u64,
    fence_rev: i64,
    data: Vec<u8>,
    data_rev: i64,
}

impl EtcdFencedKey {
    /// The resource at key `name`.
    ///
    /// # Errors
    /// [`EtcdError::InvalidOption`] for an empty name.
    pub fn new(etcd: &Etcd, name: &str) -> Result<Self, EtcdError> {
        check_name(name)?;
        Ok(EtcdFencedKey {
            etcd: etcd.clone(),
            data: name.as_bytes().to_vec(),
            fence: format!("{name}.fence").into_bytes(),
        })
    }

    /// The high-water mark, the data, and both keys' mod revisions (0: absent).
    fn load(&self) -> Result<Loaded, EtcdError> {
        let txn = Txn::new().and_then([
            TxnOp::get(self.fence.clone(), None),
            TxnOp::get(self.data.clone(), None),
        ]);
        let resp = self.etcd.txn("fenced read", &self.data, txn)?;
        let fence = match nth_get(&resp, 0) {
            None => (0, 0),
            Some(f) => {
                let mark = std::str::from_utf8(&f.value)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| EtcdError::Protocol {
                        op: "fenced read",
                        key: key_str(&self.fence),
                        detail: "the fence is not a decimal token",
                    })?;
                (mark, f.modified)
            }
        };
        let (data, data_rev) = nth_get(&resp, 1).map_or((Vec::new(), 0), |f| (f.value, f.modified));
        Ok(Loaded {
            mark: fence.0,
            fence_rev: fence.1,
            data,
            data_rev,
        })
    }

    fn put(&self, token: u64, data: &[u8], append: bool) -> Result<bool, EtcdError> {
        loop {
            let Loaded {
                mark,
                fence_rev,
                data: old,
                data_rev,
            } = self.load()?;
            if token < mark {
                return Ok(false);
            }
            let value = if append {
                let mut v = old;
                v.extend_from_slice(data);
                v
            } else {
                data.to_vec()
            };
            let txn = Txn::new()
                .when([
                    Compare::mod_revision(self.fence.clone(), CompareOp::Equal, fence_rev),
                    Compare::mod_revision(self.data.clone(), CompareOp::Equal, data_rev),
                ])
                .and_then([
                    TxnOp::put(self.fence.clone(), token.to_string(), None),
                    TxnOp::put(self.data.clone(), value, None),
                ]);
            if self.etcd.txn("fenced write", &self.data, txn)?.succeeded() {
                return Ok(true);
            }
        }
    }
}

impl FencedResource for EtcdFencedKey {
    type Error = EtcdError;

    fn write(&self, token: u64, data: &[u8]) -> Result<bool, EtcdError> {
        self.put(token, data, false)
    }

    fn append(&self, token: u64, data: &[u8]) -> Result<bool, EtcdError> {
        self.put(token, data, true)
    }

    fn read(&self) -> Result<(u64, Vec<u8>), EtcdError> {
        let l = self.load()?;
        Ok((l.mark, l.data))
    }
}
