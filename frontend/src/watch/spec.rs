//! What one watcher selects: its key range (etcd's range rules), its NOPUT/NODELETE filters and
//! whether it wants prev_kv; and turning a batch of store events into what that watcher is sent.

use api::etcdserverpb::WatchCreateRequest;
use api::etcdserverpb::watch_create_request::FilterType;
use api::mvccpb::Event;
use api::mvccpb::event::EventType;

/// The selection of one watcher, fixed at creation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// First key watched (never empty: etcd turns an empty key into `"\0"`, the smallest key).
    pub key: Vec<u8>,
    /// etcd's range end: empty = the single key `key`, `"\0"` = every key >= `key`, else
    /// `[key, range_end)`.
    pub range_end: Vec<u8>,
    pub no_put: bool,
    pub no_delete: bool,
    pub prev_kv: bool,
}

impl WatchSpec {
    /// The selection a create request asks for, normalised as etcd's watch server does.
    pub fn from_request(req: &WatchCreateRequest) -> Self {
        let key = if req.key.is_empty() {
            vec![0]
        } else {
            req.key.clone()
        };
        let mut no_put = false;
        let mut no_delete = false;
        for f in &req.filters {
            match FilterType::try_from(*f) {
                Ok(FilterType::Noput) => no_put = true,
                Ok(FilterType::Nodelete) => no_delete = true,
                // etcd ignores filter values it does not know.
                Err(_) => {}
            }
        }
        Self {
            key,
            range_end: req.range_end.clone(),
            no_put,
            no_delete,
            prev_kv: req.prev_kv,
        }
    }

    /// A spec for `key`/`range_end` with no filters and no prev_kv.
    pub fn range(key: &[u8], range_end: &[u8]) -> Self {
        Self {
            key: key.to_vec(),
            range_end: range_end.to_vec(),
            no_put: false,
            no_delete: false,
            prev_kv: false,
        }
    }

    /// True when the range holds no key: an end not above the key (etcd's watchStream refuses
    /// such a watcher with "mvcc: watcher range is empty"; `"\0"`, every key from `key`, is
    /// not an end).
    pub fn is_empty(&self) -> bool {
        !self.range_end.is_empty() && self.range_end.as_slice() != [0] && self.key >= self.range_end
    }

    /// True when `k` lies in the watched range.
    pub fn contains(&self, k: &[u8]) -> bool {
        if self.range_end.is_empty() {
            k == self.key.as_slice()
        } else if self.range_end.as_slice() == [0] {
            k >= self.key.as_slice()
        } else {
            k >= self.key.as_slice() && k < self.range_end.as_slice()
        }
    }

    /// True when the event passes the key range and the filters.
    pub fn selects(&self, ev: &Event) -> bool {
        let Some(kv) = ev.kv.as_ref() else {
            return false;
        };
        if !self.contains(&kv.key) {
            return false;
        }
        let is_delete = ev.r#type == EventType::Delete as i32;
        !((is_delete && self.no_delete) || (!is_delete && self.no_put))
    }

    /// The event as this watcher is sent it: prev_kv only when asked for (the store fills it
    /// whenever it is still in history).
    pub fn shape(&self, ev: &Event) -> Event {
        let mut out = ev.clone();
        if !self.prev_kv {
            out.prev_kv = None;
        }
        out
    }
}

/// The revision an event happened at (for a delete, the tombstone's revision, which the store
/// puts in `kv.mod_revision` as etcd does).
pub fn event_revision(ev: &Event) -> i64 {
    ev.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::mvccpb::KeyValue;

    fn ev(t: EventType, key: &[u8]) -> Event {
        Event {
            r#type: t as i32,
            kv: Some(KeyValue {
                key: key.to_vec(),
                mod_revision: 5,
                ..Default::default()
            }),
            prev_kv: Some(KeyValue {
                key: key.to_vec(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn ranges_follow_etcd_rules() {
        let single = WatchSpec::range(b"a", b"");
        assert!(single.contains(b"a"));
        assert!(!single.contains(b"ab"));
        let from = WatchSpec::range(b"b", b"\0");
        assert!(from.contains(b"b") && from.contains(b"zzz"));
        assert!(!from.contains(b"a"));
        let half_open = WatchSpec::range(b"b", b"d");
        assert!(half_open.contains(b"b") && half_open.contains(b"cz"));
        assert!(!half_open.contains(b"d"));
        let empty = WatchSpec::range(b"d", b"b");
        assert!(!empty.contains(b"c"));
    }

    #[test]
    fn empty_key_means_smallest_key_and_filters_apply() {
        let req = WatchCreateRequest {
            key: vec![],
            range_end: vec![0],
            filters: vec![FilterType::Noput as i32, 42],
            ..Default::default()
        };
        let spec = WatchSpec::from_request(&req);
        assert_eq!(spec.key, vec![0]);
        assert!(spec.no_put && !spec.no_delete);
        assert!(!spec.selects(&ev(EventType::Put, b"x")));
        assert!(spec.selects(&ev(EventType::Delete, b"x")));
    }

    #[test]
    fn prev_kv_only_when_asked() {
        let mut spec = WatchSpec::range(b"x", b"");
        assert!(spec.shape(&ev(EventType::Put, b"x")).prev_kv.is_none());
        spec.prev_kv = true;
        assert!(spec.shape(&ev(EventType::Put, b"x")).prev_kv.is_some());
    }
}
