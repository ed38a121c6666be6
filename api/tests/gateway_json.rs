//! The JSON mapping of etcd's messages is the one etcd's gateway speaks: proto field names,
//! 64-bit integers as strings, bytes in base64, enum values by name, default values left out,
//! unknown fields ignored. Expected strings are etcd 3.4's own answers, captured with curl.

use api::etcdserverpb::{
    LeaseGrantResponse, RangeRequest, RangeResponse, ResponseHeader, WatchResponse, range_request,
};
use api::mvccpb::{Event, KeyValue, event::EventType};

fn header(revision: i64) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        cluster_id: 324952591200643719,
        member_id: 3319814642761637952,
        revision,
        raft_term: 2,
    })
}

const HEADER_5: &str = r#"{"cluster_id":"324952591200643719","member_id":"3319814642761637952","revision":"5","raft_term":"2"}"#;

#[test]
fn a_range_answer_prints_as_etcds_gateway_prints_it() {
    let r = RangeResponse {
        header: header(5),
        kvs: vec![KeyValue {
            key: b"foo".to_vec(),
            create_revision: 2,
            mod_revision: 2,
            version: 1,
            value: b"bar".to_vec(),
            lease: 0,
        }],
        more: false,
        count: 1,
    };
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        format!(
            r#"{{"header":{HEADER_5},"kvs":[{{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}}],"count":"1"}}"#
        )
    );
}

#[test]
fn a_delete_event_names_its_type_and_a_put_leaves_it_out() {
    let prev = KeyValue {
        key: b"bar".to_vec(),
        create_revision: 3,
        mod_revision: 4,
        version: 2,
        value: b"2".to_vec(),
        lease: 0,
    };
    let r = WatchResponse {
        header: header(5),
        watch_id: 7,
        events: vec![Event {
            r#type: EventType::Delete as i32,
            kv: Some(KeyValue {
                key: b"bar".to_vec(),
                mod_revision: 5,
                ..KeyValue::default()
            }),
            prev_kv: Some(prev),
        }],
        ..WatchResponse::default()
    };
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        format!(
            r#"{{"header":{HEADER_5},"watch_id":"7","events":[{{"type":"DELETE","kv":{{"key":"YmFy","mod_revision":"5"}},"prev_kv":{{"key":"YmFy","create_revision":"3","mod_revision":"4","version":"2","value":"Mg=="}}}}]}}"#
        )
    );
    let put = Event {
        r#type: EventType::Put as i32,
        kv: Some(KeyValue::default()),
        prev_kv: None,
    };
    assert_eq!(serde_json::to_string(&put).unwrap(), r#"{"kv":{}}"#);
}

#[test]
fn upper_case_proto_names_stay_as_etcd_wrote_them() {
    let r = LeaseGrantResponse {
        header: header(1),
        id: 2324035754011832582,
        ttl: 2,
        error: String::new(),
    };
    let json = serde_json::to_string(&r).unwrap();
    assert!(
        json.ends_with(r#""ID":"2324035754011832582","TTL":"2"}"#),
        "{json}"
    );
}

#[test]
fn requests_take_proto_or_json_names_numbers_or_strings_and_ignore_unknown_fields() {
    let r: RangeRequest = serde_json::from_str(
        r#"{"key":"AA==","range_end":"AA==","sort_order":"DESCEND","sortTarget":2,
            "limit":"1","keysOnly":true,"revision":3,"bogus":{"x":[1]}}"#,
    )
    .unwrap();
    assert_eq!(r.key, vec![0]);
    assert_eq!(r.range_end, vec![0]);
    assert_eq!(r.sort_order, range_request::SortOrder::Descend as i32);
    assert_eq!(r.sort_target, range_request::SortTarget::Create as i32);
    assert_eq!((r.limit, r.revision), (1, 3));
    assert!(r.keys_only);
    let empty: RangeRequest = serde_json::from_str("{}").unwrap();
    assert_eq!(empty, RangeRequest::default());
}
