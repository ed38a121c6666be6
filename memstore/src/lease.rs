//! The lease table: granted leases, their deadlines in journal time, the keys attached to each,
//! and the deadline order in which they expire.

use std::collections::{BTreeMap, BTreeSet};

/// One granted lease.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub(crate) struct Lease {
    pub id: i64,
    /// Granted TTL in seconds (after etcd's minimum is applied).
    pub ttl: i64,
    /// Journal time (ms) at which the lease expires.
    pub deadline_ms: i64,
    /// Keys currently attached.
    pub keys: BTreeSet<Box<[u8]>>,
}

/// All leases of a tenant.
#[derive(
    Debug, Clone, Default, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub(crate) struct LeaseTable {
    pub leases: BTreeMap<i64, Lease>,
    /// (deadline_ms, id) of every lease: the expiry order.
    pub by_deadline: BTreeSet<(i64, i64)>,
}

impl LeaseTable {
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    pub fn contains(&self, id: i64) -> bool {
        self.leases.contains_key(&id)
    }

    pub fn get(&self, id: i64) -> Option<&Lease> {
        self.leases.get(&id)
    }

    pub fn grant(&mut self, id: i64, ttl: i64, deadline_ms: i64) {
        self.by_deadline.insert((deadline_ms, id));
        self.leases.insert(
            id,
            Lease {
                id,
                ttl,
                deadline_ms,
                keys: BTreeSet::new(),
            },
        );
    }

    /// Removes the lease and returns it (its keys are the caller's to delete).
    pub fn remove(&mut self, id: i64) -> Option<Lease> {
        let lease = self.leases.remove(&id)?;
        self.by_deadline.remove(&(lease.deadline_ms, id));
        Some(lease)
    }

    /// Moves the lease's deadline.
    pub fn set_deadline(&mut self, id: i64, deadline_ms: i64) {
        if let Some(l) = self.leases.get_mut(&id) {
            self.by_deadline.remove(&(l.deadline_ms, id));
            l.deadline_ms = deadline_ms;
            self.by_deadline.insert((deadline_ms, id));
        }
    }

    /// The lease expiring first, if its deadline is at or before `now_ms`.
    pub fn next_expired(&self, now_ms: i64) -> Option<i64> {
        self.by_deadline
            .first()
            .filter(|(deadline, _)| *deadline <= now_ms)
            .map(|(_, id)| *id)
    }

    pub fn attach(&mut self, id: i64, key: &[u8]) {
        if let Some(l) = self.leases.get_mut(&id) {
            l.keys.insert(key.into());
        }
    }

    pub fn detach(&mut self, id: i64, key: &[u8]) {
        if let Some(l) = self.leases.get_mut(&id) {
            l.keys.remove(key);
        }
    }

    /// Every lease's deadline moves `by_ms` later (journal time that did not count).
    pub fn postpone_all(&mut self, by_ms: i64) {
        self.by_deadline.clear();
        for l in self.leases.values_mut() {
            l.deadline_ms = l.deadline_ms.saturating_add(by_ms);
            self.by_deadline.insert((l.deadline_ms, l.id));
        }
    }

    /// Every lease's deadline becomes `now_ms + ttl + extend_ms` (etcd's lessor Promote).
    pub fn extend_all(&mut self, now_ms: i64, extend_ms: i64) {
        self.by_deadline.clear();
        for l in self.leases.values_mut() {
            l.deadline_ms = now_ms
                .saturating_add(l.ttl.saturating_mul(1000))
                .saturating_add(extend_ms);
            self.by_deadline.insert((l.deadline_ms, l.id));
        }
    }
}
