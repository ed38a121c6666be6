//! etcd's JSON gateway (`POST /v3/...` on the client port) with `curl`, against `strata dev` or
//! a real etcd 3.4 (`STRATA_TEST_TARGET=etcd`): every expectation here is etcd's. Only the HTTP
//! status of a FailedPrecondition differs by version (412 from etcd 3.4's gateway, 400 from
//! 3.5's, which Strata follows).

use std::time::Duration;

use serde_json::{Value, json};
use strata_tests::curl::{b64, post, post_lines, post_with, request};
use strata_tests::target::{Target, TargetKind};

/// How long a stream may take to print what it must print.
const STREAM_TIMEOUT: Duration = Duration::from_secs(30);

fn parse(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// A POST that must succeed: its JSON answer.
fn ok(t: &Target, path: &str, body: Value) -> Value {
    let (code, answer) = post(t.endpoint(), path, &body.to_string());
    assert_eq!(code, 200, "POST {path} {body}: {answer}");
    parse(&answer)
}

/// A POST that must fail with gRPC `code` and etcd's `message`: the HTTP status.
fn fails(t: &Target, path: &str, body: &str, code: i64, message: &str) -> u16 {
    let (status, answer) = post(t.endpoint(), path, body);
    let v = parse(&answer);
    assert_eq!(v["code"], code, "POST {path} {body}: {answer}");
    assert_eq!(v["error"], message, "{answer}");
    assert_eq!(v["message"], message, "{answer}");
    status
}

/// A 64-bit integer as the gateway prints it: a string.
fn int(v: &Value) -> i64 {
    v.as_str()
        .unwrap_or_else(|| panic!("not a string-encoded integer: {v}"))
        .parse()
        .unwrap()
}

fn revision(v: &Value) -> i64 {
    int(&v["header"]["revision"])
}

#[tokio::test]
async fn kv_requests_and_errors_as_etcds_gateway_answers_them() {
    let t = Target::start().await;
    let put = ok(
        &t,
        "/v3/kv/put",
        json!({"key": b64(b"gw/a"), "value": b64(b"1")}),
    );
    let first = revision(&put);
    assert!(put.get("prev_kv").is_none(), "{put}");
    // camelCase names and numbers as numbers are taken too; unknown fields are ignored.
    let again = ok(
        &t,
        "/v3/kv/put",
        json!({"key": b64(b"gw/a"), "value": b64(b"2"), "prevKv": true, "bogus": [1]}),
    );
    assert_eq!(revision(&again), first + 1);
    assert_eq!(again["prev_kv"]["value"], b64(b"1"));
    ok(
        &t,
        "/v3/kv/put",
        json!({"key": b64(b"gw/b"), "value": b64(b"3")}),
    );

    let one = ok(&t, "/v3/kv/range", json!({"key": b64(b"gw/a")}));
    assert_eq!(one["count"], "1");
    let kv = &one["kvs"][0];
    assert_eq!(kv["key"], b64(b"gw/a"));
    assert_eq!(kv["value"], b64(b"2"));
    assert_eq!(int(&kv["create_revision"]), first);
    assert_eq!(int(&kv["mod_revision"]), first + 1);
    assert_eq!(kv["version"], "2");
    assert!(kv.get("lease").is_none(), "zero values are left out: {kv}");

    // A prefix, newest first by key, keys only, one of two, with `more`.
    let page = ok(
        &t,
        "/v3/kv/range",
        json!({"key": b64(b"gw/"), "range_end": b64(b"gw0"), "sort_order": "DESCEND",
               "limit": 1, "keys_only": true}),
    );
    assert_eq!(page["count"], "2");
    assert_eq!(page["more"], true);
    assert_eq!(page["kvs"][0]["key"], b64(b"gw/b"));
    assert!(page["kvs"][0].get("value").is_none(), "{page}");
    // An older revision.
    let old = ok(
        &t,
        "/v3/kv/range",
        json!({"key": b64(b"gw/a"), "revision": first.to_string()}),
    );
    assert_eq!(old["kvs"][0]["value"], b64(b"1"));

    // A compare-and-swap txn, both ways.
    let cas = |expect: i64, value: &[u8]| {
        json!({
            "compare": [{"key": b64(b"gw/a"), "target": "MOD", "result": "EQUAL",
                         "mod_revision": expect.to_string()}],
            "success": [{"request_put": {"key": b64(b"gw/a"), "value": b64(value)}}],
            "failure": [{"request_range": {"key": b64(b"gw/a")}}],
        })
    };
    let won = ok(&t, "/v3/kv/txn", cas(first + 1, b"3"));
    assert_eq!(won["succeeded"], true);
    assert!(won["responses"][0]["response_put"].is_object(), "{won}");
    let lost = ok(&t, "/v3/kv/txn", cas(first + 1, b"4"));
    assert!(lost.get("succeeded").is_none(), "false is left out: {lost}");
    let seen = &lost["responses"][0]["response_range"]["kvs"][0];
    assert_eq!(seen["value"], b64(b"3"));

    let deleted = ok(
        &t,
        "/v3/kv/deleterange",
        json!({"key": b64(b"gw/"), "range_end": b64(b"gw0"), "prev_kv": true}),
    );
    assert_eq!(deleted["deleted"], "2");
    assert_eq!(deleted["prev_kvs"].as_array().unwrap().len(), 2);
    let compacted = ok(
        &t,
        "/v3/kv/compaction",
        json!({"revision": first.to_string()}),
    );
    assert!(revision(&compacted) > first);

    // etcd's errors, with grpc-gateway's body and statuses.
    const EMPTY_KEY: &str = "etcdserver: key is not provided";
    assert_eq!(fails(&t, "/v3/kv/range", "", 3, EMPTY_KEY), 400);
    assert_eq!(fails(&t, "/v3/kv/put", "{}", 3, EMPTY_KEY), 400);
    let future = json!({"key": b64(b"gw/a"), "revision": "1000000"}).to_string();
    const FUTURE: &str = "etcdserver: mvcc: required revision is a future revision";
    assert_eq!(fails(&t, "/v3/kv/range", &future, 11, FUTURE), 400);
    let compacted = json!({"key": b64(b"gw/a"), "revision": "1"}).to_string();
    const COMPACTED: &str = "etcdserver: mvcc: required revision has been compacted";
    assert_eq!(fails(&t, "/v3/kv/range", &compacted, 11, COMPACTED), 400);
    let (status, answer) = post(t.endpoint(), "/v3/kv/range", "not json");
    assert_eq!(
        (status, parse(&answer)["code"].clone()),
        (400, json!(3)),
        "{answer}"
    );
    // Only POST; unknown methods are not found.
    assert_eq!(request(t.endpoint(), "GET", "/v3/kv/range", "").0, 405);
    assert_eq!(request(t.endpoint(), "PUT", "/v3/kv/range", "{}").0, 405);
    assert_eq!(post(t.endpoint(), "/v3/kv/nothing", "{}").0, 404);
    assert_eq!(request(t.endpoint(), "GET", "/v3/kv/nothing", "").0, 404);
    // etcd 3.4 serves the same under /v3beta/.
    let beta = ok(&t, "/v3beta/kv/range", json!({"key": b64(b"gw/a")}));
    assert!(beta.get("kvs").is_none(), "deleted: {beta}");
}

#[tokio::test]
async fn watch_and_keep_alive_stream_one_json_line_per_answer() {
    let t = Target::start().await;
    let creates = json!({"create_request": {"key": b64(b"gw/w")}}).to_string()
        + " "
        + &json!({"create_request": {"key": b64(b"gw/p"), "prev_kv": true, "watch_id": 7}})
            .to_string();
    let watch = post_lines(t.endpoint(), "/v3/watch", &creates);
    let created: Vec<Value> = watch
        .take(2, STREAM_TIMEOUT)
        .iter()
        .map(|l| parse(l))
        .collect();
    assert_eq!(created[0]["result"]["created"], true);
    assert!(
        created[0]["result"].get("watch_id").is_none(),
        "id 0: {}",
        created[0]
    );
    assert_eq!(created[1]["result"]["watch_id"], "7");

    ok(
        &t,
        "/v3/kv/put",
        json!({"key": b64(b"gw/w"), "value": b64(b"x")}),
    );
    ok(
        &t,
        "/v3/kv/put",
        json!({"key": b64(b"gw/p"), "value": b64(b"1")}),
    );
    ok(&t, "/v3/kv/deleterange", json!({"key": b64(b"gw/p")}));
    let events: Vec<Value> = watch
        .take(3, STREAM_TIMEOUT)
        .iter()
        .map(|l| parse(l))
        .collect();
    let put = &events[0]["result"];
    assert!(
        put["events"][0].get("type").is_none(),
        "PUT is the default: {put}"
    );
    assert_eq!(put["events"][0]["kv"]["value"], b64(b"x"));
    assert_eq!(events[1]["result"]["watch_id"], "7");
    let delete = &events[2]["result"]["events"][0];
    assert_eq!(delete["type"], "DELETE");
    assert_eq!(delete["kv"]["key"], b64(b"gw/p"));
    assert_eq!(delete["prev_kv"]["value"], b64(b"1"));

    let lease = ok(&t, "/v3/lease/grant", json!({"TTL": "60"}));
    let id = lease["ID"].as_str().unwrap().to_string();
    assert_eq!(lease["TTL"], "60");
    let renew = json!({"ID": id}).to_string() + &json!({"ID": "12345"}).to_string();
    let answers: Vec<Value> = post_lines(t.endpoint(), "/v3/lease/keepalive", &renew)
        .until_end(STREAM_TIMEOUT)
        .iter()
        .map(|l| parse(l))
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(answers[0]["result"]["ID"], id.as_str());
    assert_eq!(answers[0]["result"]["TTL"], "60");
    assert_eq!(answers[1]["result"]["ID"], "12345");
    assert!(
        answers[1]["result"].get("TTL").is_none(),
        "a missing lease: TTL 0"
    );
}

#[tokio::test]
async fn leases_cluster_and_maintenance_over_json() {
    let t = Target::start().await;
    let lease = ok(&t, "/v3/lease/grant", json!({"TTL": 60}));
    let id = lease["ID"].as_str().unwrap().to_string();
    ok(
        &t,
        "/v3/kv/put",
        json!({"key": b64(b"gw/l"), "value": b64(b"v"), "lease": id}),
    );
    let ttl = ok(&t, "/v3/lease/timetolive", json!({"ID": id, "keys": true}));
    assert_eq!(ttl["grantedTTL"], "60");
    assert_eq!(ttl["keys"], json!([b64(b"gw/l")]));
    let leases = ok(&t, "/v3/lease/leases", json!({}));
    assert!(
        leases["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["ID"] == id.as_str())
    );
    ok(&t, "/v3/lease/revoke", json!({"ID": id}));
    let gone = ok(&t, "/v3/kv/range", json!({"key": b64(b"gw/l")}));
    assert!(gone.get("kvs").is_none(), "{gone}");
    let missing = json!({"ID": id}).to_string();
    const NO_LEASE: &str = "etcdserver: requested lease not found";
    assert_eq!(fails(&t, "/v3/lease/revoke", &missing, 5, NO_LEASE), 404);
    assert_eq!(
        ok(&t, "/v3/lease/timetolive", json!({"ID": id}))["TTL"],
        "-1"
    );

    let members = ok(&t, "/v3/cluster/member/list", json!({}));
    let listed = members["members"].as_array().unwrap();
    assert!(
        listed.iter().any(|m| m["clientURLs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|u| u == t.endpoint())),
        "{members}"
    );
    let unknown = json!({"ID": "1"}).to_string();
    assert_eq!(
        fails(
            &t,
            "/v3/cluster/member/remove",
            &unknown,
            5,
            "etcdserver: member not found"
        ),
        404
    );
    let status = ok(&t, "/v3/maintenance/status", json!({}));
    assert!(
        status["version"].as_str().unwrap().starts_with("3."),
        "{status}"
    );
    assert!(int(&status["dbSize"]) > 0, "{status}");
    assert!(ok(&t, "/v3/maintenance/hash", json!({}))["hash"].is_u64());
    let precondition = fails(
        &t,
        "/v3/maintenance/transfer-leadership",
        &json!({"targetID": "1"}).to_string(),
        9,
        "etcdserver: bad leader transferee",
    );
    let expected = if t.kind() == TargetKind::Etcd {
        412
    } else {
        400
    };
    assert_eq!(precondition, expected, "FailedPrecondition's HTTP status");
    // Auth is disabled: Authenticate says so, and there is no user.
    let login = json!({"name": "root", "password": "pw"}).to_string();
    const NOT_ENABLED: &str = "etcdserver: authentication is not enabled";
    assert_eq!(
        fails(&t, "/v3/auth/authenticate", &login, 9, NOT_ENABLED),
        expected
    );
    let users = ok(&t, "/v3/auth/user/list", json!({}));
    assert!(users.get("users").is_none(), "{users}");
    // Users are managed through the gateway as through gRPC.
    ok(
        &t,
        "/v3/auth/user/add",
        json!({"name": "gw", "password": "pw"}),
    );
    ok(&t, "/v3/auth/role/add", json!({"name": "gw-role"}));
    ok(
        &t,
        "/v3/auth/user/grant",
        json!({"user": "gw", "role": "gw-role"}),
    );
    let user = ok(&t, "/v3/auth/user/get", json!({"name": "gw"}));
    assert_eq!(user["roles"], json!(["gw-role"]), "{user}");
    let users = ok(&t, "/v3/auth/user/list", json!({}));
    assert_eq!(users["users"], json!(["gw"]), "{users}");

    // The snapshot, as chunks: the last one is the SHA-256 of the others (32 bytes).
    let chunks: Vec<Value> = post_lines(t.endpoint(), "/v3/maintenance/snapshot", "")
        .until_end(STREAM_TIMEOUT)
        .iter()
        .map(|l| parse(l))
        .collect();
    assert!(chunks.len() >= 2, "{chunks:?}");
    let last = &chunks[chunks.len() - 1]["result"];
    assert!(last.get("remaining_bytes").is_none(), "0 left: {last}");
    assert_eq!(
        last["blob"].as_str().unwrap().len(),
        44,
        "base64 of 32 bytes"
    );
    assert!(
        chunks[0]["result"]["blob"].as_str().unwrap().len() > 44,
        "the content first"
    );
}

/// With auth enabled, a gateway client sends its token in the `Authorization` header (etcd's
/// gateway turns it into the `authorization` metadata its server reads): with it the user's
/// requests are served, without it they are refused as etcd refuses them.
#[tokio::test]
async fn the_token_travels_in_the_authorization_header() {
    let t = Target::start().await;
    ok(
        &t,
        "/v3/auth/user/add",
        json!({"name": "root", "password": "rootpw"}),
    );
    ok(
        &t,
        "/v3/auth/user/grant",
        json!({"user": "root", "role": "root"}),
    );
    ok(&t, "/v3/auth/enable", json!({}));
    let login = ok(
        &t,
        "/v3/auth/authenticate",
        json!({"name": "root", "password": "rootpw"}),
    );
    let token = login["token"].as_str().expect("a token").to_string();
    let put = json!({"key": b64(b"gw/auth"), "value": b64(b"v")}).to_string();
    fails(&t, "/v3/kv/put", &put, 3, "etcdserver: user name is empty");
    let with_token = [("Authorization", token.as_str())];
    let (code, answer) = post_with(t.endpoint(), "/v3/kv/put", &put, &with_token);
    assert_eq!(code, 200, "{answer}");
    let range = json!({"key": b64(b"gw/auth")}).to_string();
    let (code, answer) = post_with(t.endpoint(), "/v3/kv/range", &range, &with_token);
    assert_eq!(code, 200, "{answer}");
    assert_eq!(parse(&answer)["kvs"][0]["value"], b64(b"v"), "{answer}");
    let (code, answer) = post_with(t.endpoint(), "/v3/auth/disable", "{}", &with_token);
    assert_eq!(code, 200, "{answer}");
    ok(&t, "/v3/kv/range", json!({"key": b64(b"gw/auth")}));
}

/// etcd's Lock and Election services on their gateway paths (`/v3/lock/*`, `/v3/election/*`):
/// a lock's key, a leader key, Observe as a stream of JSON lines, and etcd's error for an
/// election with no leader.
#[tokio::test]
async fn lock_and_election_over_json() {
    let t = Target::start().await;
    let lease = ok(&t, "/v3/lease/grant", json!({"TTL": "60"}));
    let id = lease["ID"].as_str().unwrap().to_string();
    let hex = format!("{:x}", id.parse::<i64>().unwrap());

    let locked = ok(
        &t,
        "/v3/lock/lock",
        json!({"name": b64(b"gw-lock"), "lease": id}),
    );
    let key = format!("gw-lock/{hex}");
    assert_eq!(locked["key"], b64(key.as_bytes()), "{locked}");
    let held = ok(&t, "/v3/kv/range", json!({"key": b64(key.as_bytes())}));
    assert_eq!(held["count"], "1", "{held}");
    ok(&t, "/v3/lock/unlock", json!({"key": b64(key.as_bytes())}));
    let gone = ok(&t, "/v3/kv/range", json!({"key": b64(key.as_bytes())}));
    assert!(gone.get("count").is_none(), "still held: {gone}");

    fails(
        &t,
        "/v3/election/leader",
        &json!({"name": b64(b"gw-el")}).to_string(),
        2,
        "election: no leader",
    );
    let won = ok(
        &t,
        "/v3/election/campaign",
        json!({"name": b64(b"gw-el"), "value": b64(b"one"), "lease": id}),
    );
    let leader = won["leader"].clone();
    assert_eq!(
        leader["key"],
        b64(format!("gw-el/{hex}").as_bytes()),
        "{won}"
    );
    assert_eq!(int(&leader["rev"]), revision(&won));
    let observe = post_lines(
        t.endpoint(),
        "/v3/election/observe",
        &json!({"name": b64(b"gw-el")}).to_string(),
    );
    let first = parse(&observe.take(1, STREAM_TIMEOUT)[0]);
    assert_eq!(first["result"]["kv"]["value"], b64(b"one"), "{first}");
    ok(
        &t,
        "/v3/election/proclaim",
        json!({"leader": leader, "value": b64(b"two")}),
    );
    let second = parse(&observe.take(1, STREAM_TIMEOUT)[0]);
    assert_eq!(second["result"]["kv"]["value"], b64(b"two"), "{second}");
    let now = ok(&t, "/v3/election/leader", json!({"name": b64(b"gw-el")}));
    assert_eq!(now["kv"]["value"], b64(b"two"));
    ok(&t, "/v3/election/resign", json!({"leader": leader}));
    fails(
        &t,
        "/v3/election/leader",
        &json!({"name": b64(b"gw-el")}).to_string(),
        2,
        "election: no leader",
    );
}
