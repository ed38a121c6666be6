//! A journal node cut off from its two peers (TCP proxies the test controls sit on every link
//! to and from it) cannot commit anything, the other two carry on, and it rejoins cleanly.

use std::collections::BTreeMap;
use std::time::Duration;

use api::strata::journal::record::Kind;
use strata_tests::journal::{JournalCluster, TcpProxy, append_acked};
use strata_tests::process::free_port;

/// Node 3 campaigns first for shard 2 of 3, so it starts as that shard's leader.
const SHARDS: u32 = 3;
const SHARD: u32 = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cut_off_node_cannot_commit_and_rejoins() {
    let addr = |_: u64| format!("127.0.0.1:{}", free_port());
    let addrs: BTreeMap<u64, String> = (1..=3).map(|id| (id, addr(id))).collect();
    let to3_from1 = TcpProxy::start(addrs[&3].clone()).await;
    let to3_from2 = TcpProxy::start(addrs[&3].clone()).await;
    let to1_from3 = TcpProxy::start(addrs[&1].clone()).await;
    let to2_from3 = TcpProxy::start(addrs[&2].clone()).await;
    let peers = BTreeMap::from([
        (
            1,
            format!("1={},2={},3={}", addrs[&1], addrs[&2], to3_from1.addr),
        ),
        (
            2,
            format!("1={},2={},3={}", addrs[&1], addrs[&2], to3_from2.addr),
        ),
        (
            3,
            format!("1={},2={},3={}", to1_from3.addr, to2_from3.addr, addrs[&3]),
        ),
    ]);
    let c = JournalCluster::start_with_peers(&addrs, &peers, SHARDS, &[]);
    c.wait_leaders(&[0, 1, 2]).await;
    let all = c.client().await;
    let mut acked = BTreeMap::new();
    append_acked(&all, SHARD, "before", 50, &mut acked).await;
    let before = *acked.keys().last().unwrap();
    c.wait_committed(2, SHARD, before).await;

    for p in [&to3_from1, &to3_from2, &to1_from3, &to2_from3] {
        p.cut();
    }
    // Node 3 alone cannot commit: an append sent only to it is never acknowledged.
    let only3 = c.client_of(2).await;
    let lonely = tokio::time::timeout(
        Duration::from_secs(8),
        only3.append(SHARD, vec![b"minority".to_vec()]),
    )
    .await;
    assert!(
        !matches!(lonely, Ok(Ok(_))),
        "the cut-off node acknowledged an append: {lonely:?}"
    );
    // The majority elects a leader and carries on.
    let two = journal::JournalClient::connect(&[c.nodes[0].addr.clone(), c.nodes[1].addr.clone()])
        .await
        .unwrap();
    append_acked(&two, SHARD, "during", 50, &mut acked).await;
    let during = *acked.keys().last().unwrap();
    let st3 = only3.status_of(&c.nodes[2].addr, SHARD).await.unwrap();
    assert!(
        st3.committed_index < during,
        "cut-off node claims {} committed, past {during}",
        st3.committed_index
    );

    for p in [&to3_from1, &to3_from2, &to1_from3, &to2_from3] {
        p.heal();
    }
    // Rejoined: node 3 holds exactly what the others hold, acknowledged entries included,
    // and nothing of its own minority append.
    let last = during;
    let mut reference = None;
    for i in 0..3 {
        let recs = c.read_node(i, SHARD, 0, last).await;
        for (k, r) in recs.iter().enumerate() {
            assert_eq!(r.index, k as u64);
            if let Some(p) = acked.get(&r.index) {
                assert_eq!(
                    r.kind,
                    Some(Kind::Data(p.clone())),
                    "node {} index {}",
                    i + 1,
                    r.index
                );
            }
            assert_ne!(
                r.kind,
                Some(Kind::Data(b"minority".to_vec())),
                "minority append committed"
            );
        }
        match &reference {
            None => reference = Some(recs),
            Some(r0) => assert_eq!(r0, &recs, "node {} differs", i + 1),
        }
    }
    // And the whole cluster takes writes again through node 3's link too.
    let idx = all.append(SHARD, vec![b"healed".to_vec()]).await.unwrap()[0];
    c.wait_committed(2, SHARD, idx).await;
}
