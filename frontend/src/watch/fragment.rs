//! Splitting a watch response larger than the size limit into fragments, as etcd does for
//! watchers created with `fragment=true`: every fragment carries at least one event, all but the
//! last have `fragment=true`, and events are never reordered.

use api::etcdserverpb::WatchResponse;
use prost::Message;

/// Bytes one event adds to an encoded `WatchResponse` (field 11: a one-byte tag, the length,
/// the event).
fn event_cost(ev: &api::mvccpb::Event) -> usize {
    let len = ev.encoded_len();
    1 + prost::length_delimiter_len(len) + len
}

/// The responses to send for `resp`: `resp` itself when it is smaller than `max_bytes` or has
/// fewer than two events, else fragments each smaller than `max_bytes` unless a single event
/// alone is larger.
pub fn fragments(resp: WatchResponse, max_bytes: usize) -> Vec<WatchResponse> {
    if resp.encoded_len() < max_bytes || resp.events.len() < 2 {
        return vec![resp];
    }
    let mut shell = resp.clone();
    shell.events.clear();
    shell.fragment = true;
    let base = shell.encoded_len();
    let mut out = Vec::new();
    let mut cur = shell.clone();
    let mut size = base;
    for ev in resp.events {
        let cost = event_cost(&ev);
        if !cur.events.is_empty() && size + cost >= max_bytes {
            out.push(std::mem::replace(&mut cur, shell.clone()));
            size = base;
        }
        size += cost;
        cur.events.push(ev);
    }
    cur.fragment = false;
    out.push(cur);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::etcdserverpb::ResponseHeader;
    use api::mvccpb::{Event, KeyValue};

    fn resp(n: usize, value_len: usize) -> WatchResponse {
        WatchResponse {
            header: Some(ResponseHeader {
                revision: 9,
                ..Default::default()
            }),
            watch_id: 3,
            events: (0..n)
                .map(|i| Event {
                    kv: Some(KeyValue {
                        key: format!("k{i}").into_bytes(),
                        value: vec![b'x'; value_len],
                        mod_revision: 9,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn small_or_single_event_responses_are_not_split() {
        assert_eq!(fragments(resp(3, 10), 1 << 20).len(), 1);
        let one = fragments(resp(1, 5000), 100);
        assert_eq!(one.len(), 1);
        assert!(!one[0].fragment);
    }

    #[test]
    fn large_responses_split_in_order_under_the_limit() {
        let original = resp(50, 1000);
        let max = 4096;
        let parts = fragments(original.clone(), max);
        assert!(parts.len() > 1);
        let (last, rest) = parts.split_last().unwrap();
        assert!(rest.iter().all(|p| p.fragment) && !last.fragment);
        for p in &parts {
            assert!(!p.events.is_empty());
            assert!(
                p.encoded_len() < max,
                "fragment of {} bytes",
                p.encoded_len()
            );
            assert_eq!((p.watch_id, p.header), (3, original.header));
        }
        let joined: Vec<_> = parts.into_iter().flat_map(|p| p.events).collect();
        assert_eq!(joined, original.events);
    }

    #[test]
    fn an_oversized_event_travels_alone() {
        let mut r = resp(3, 100);
        r.events[1].kv.as_mut().unwrap().value = vec![b'y'; 10_000];
        let parts = fragments(r, 2000);
        assert_eq!(
            parts.iter().map(|p| p.events.len()).collect::<Vec<_>>(),
            vec![1, 1, 1]
        );
    }
}
