//! The store on a Redis Cluster of three primaries the test starts on loopback: one
//! allowance's keys in one slot, script calls on the node owning it (reloaded there after a
//! `FUNCTION FLUSH`), allowances spread over every node through one connection, each reading
//! its own node's clock, events crossing nodes, a connection brought by the caller, and the
//! public conformance suite.

mod support;

use tower_allowance::{Allowance, AllowanceConfig};
use tower_allowance_redis::{
    test_util::{unique_name, TestCluster},
    RedisStore, RedisStoreOptions,
};

async fn connect(cluster: &TestCluster, name: &str) -> RedisStore {
    RedisStore::connect_cluster(cluster.urls(), name, RedisStoreOptions::new())
        .await
        .expect("connect to the cluster")
}

fn int(reply: &str) -> i64 {
    reply
        .trim_start_matches(':')
        .parse()
        .unwrap_or_else(|_| panic!("an integer reply, got {reply:?}"))
}

#[tokio::test]
async fn one_allowance_lives_in_one_slot_on_its_node() {
    let cluster = TestCluster::start().await;
    let name = unique_name("cluster");
    let store = connect(&cluster, &name).await;
    assert!(store.is_cluster());
    let allowance = Allowance::with_store(
        AllowanceConfig::per_second(10, 2).expect("valid").exact(),
        store.clone(),
    );
    for _ in 0..3 {
        allowance.acquire().await.expect("admitted");
    }
    assert_eq!(
        allowance.snapshot().waited,
        1,
        "the third waited for a token"
    );
    // Preload, then one FCALL per admission, and no catch-up read: the first admission
    // waited for the event subscription, so nothing published since can have been missed.
    let trips = store.round_trips();
    assert_eq!(trips, 1 + 3, "{trips} round trips for 3 admissions");

    // The state key and the event channel hash to the name's slot; the key lives on the
    // node owning that slot, and nowhere else.
    let slot = |key: &str| {
        let key = key.to_owned();
        let cluster = &cluster;
        async move { int(&cluster.command(0, &["CLUSTER", "KEYSLOT", &key]).await) }
    };
    let name_slot = slot(&format!("{{{name}}}")).await;
    assert_eq!(slot(store.key()).await, name_slot);
    assert_eq!(slot(store.channel()).await, name_slot);
    let owner = cluster.node_of(store.key()).await;
    assert_eq!(
        int(&cluster.command(owner, &["EXISTS", store.key()]).await),
        1
    );
    for node in (0..3).filter(|n| *n != owner) {
        let reply = cluster.command(node, &["EXISTS", store.key()]).await;
        assert!(reply.starts_with("-MOVED"), "node {node}: {reply}");
    }

    // The function library vanishes from the owner: the next call reloads it (on every
    // primary), transparently.
    assert!(store.uses_functions());
    assert_eq!(cluster.command(owner, &["FUNCTION", "FLUSH"]).await, "+OK");
    let before = store.round_trips();
    allowance
        .acquire()
        .await
        .expect("admitted after FUNCTION FLUSH");
    assert_eq!(
        store.round_trips() - before,
        3,
        "FCALL (not found), FUNCTION LOAD, FCALL"
    );
}

#[tokio::test]
async fn allowances_on_every_node_share_one_connection() {
    let cluster = TestCluster::start().await;
    let base = connect(&cluster, &unique_name("spread")).await;
    // Names until each node owns one allowance.
    let mut per_node: [Option<RedisStore>; 3] = [None, None, None];
    for _ in 0..200 {
        let store = base.for_allowance(&unique_name("spread")).expect("valid");
        let node = cluster.node_of(store.key()).await;
        per_node[node].get_or_insert(store);
        if per_node.iter().all(Option::is_some) {
            break;
        }
    }
    let config = AllowanceConfig::per_second(5, 1).expect("valid").exact();
    for (node, store) in per_node.iter().enumerate() {
        let store = store.clone().expect("an allowance on each node");
        let allowance = Allowance::with_store(config.clone(), store.clone());
        allowance.acquire().await.expect("admitted");
        allowance.acquire().await.expect("admitted");
        assert_eq!(
            allowance.snapshot().waited,
            1,
            "node {node}: its own bucket"
        );
        assert_eq!(
            int(&cluster.command(node, &["EXISTS", store.key()]).await),
            1
        );
    }
    // One preload for all; one call per admission (each allowance decided only once its
    // channel was subscribed: no catch-up read).
    let trips = base.round_trips();
    assert_eq!(
        trips,
        1 + 6,
        "{trips} round trips for 6 admissions on 3 allowances"
    );
}

/// Each allowance reads the clock of the node its script runs on: the `TIME` of its first
/// decision, which bounds its first script calls (`validity.rs`), goes to the primary of its
/// slot. `TIME` has no key; before, the cluster connection sent it to any node, another
/// host's clock (here 6 allowances, 2 per node: all on their own node by chance 1 in 729).
#[tokio::test]
async fn each_allowance_reads_the_clock_of_its_own_node() {
    let cluster = TestCluster::start().await;
    let base = connect(&cluster, &unique_name("clock")).await;
    let mut per_node: [Vec<RedisStore>; 3] = Default::default();
    for _ in 0..400 {
        let store = base.for_allowance(&unique_name("clock")).expect("valid");
        let node = cluster.node_of(store.key()).await;
        if per_node[node].len() < 2 {
            per_node[node].push(store);
        }
        if per_node.iter().all(|s| s.len() == 2) {
            break;
        }
    }
    let mut nodes = Vec::new();
    for url in cluster.urls() {
        let client = redis::Client::open(url).expect("a node url");
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("the node answers");
        nodes.push(conn);
    }
    // Each node's TIME calls besides its scripts' (every script call reads TIME once).
    let times_outside_scripts = |mut conn: redis::aio::MultiplexedConnection| async move {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO commandstats");
        let calls = |command: &str| -> i64 {
            let prefix = format!("cmdstat_{command}:calls=");
            info.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .map_or(0, |rest| {
                    let count = rest.split(',').next().and_then(|n| n.parse().ok());
                    count.expect("a count")
                })
        };
        calls("time") - calls("fcall") - calls("evalsha") - calls("eval")
    };
    let config = AllowanceConfig::per_second(5, 1).expect("valid");
    for (owner, stores) in per_node.iter().enumerate() {
        for store in stores {
            let mut before = Vec::new();
            for conn in &nodes {
                before.push(times_outside_scripts(conn.clone()).await);
            }
            Allowance::with_store(config.clone(), store.clone())
                .acquire()
                .await
                .expect("admitted");
            for (node, conn) in nodes.iter().enumerate() {
                let asked = times_outside_scripts(conn.clone()).await - before[node];
                let want = i64::from(node == owner);
                assert_eq!(asked, want, "TIME on node {node}, the key's is {owner}");
            }
        }
    }
}

#[tokio::test]
async fn cooldown_events_cross_nodes_to_a_holder_in_another_process() {
    let cluster = TestCluster::start().await;
    // An allowance whose slot is NOT on node 0, where both processes' subscriptions sit
    // (their first seed): the script publishes on the owner, the cluster bus forwards.
    let mut name = unique_name("cross");
    for _ in 0..100 {
        if cluster.node_of(&format!("ta:{{{name}}}:s")).await != 0 {
            break;
        }
        name = unique_name("cross");
    }
    let owner = cluster.node_of(&format!("ta:{{{name}}}:s")).await;
    assert_ne!(owner, 0);
    let a = connect(&cluster, &name).await;
    let b = connect(&cluster, &name).await;
    let node0 = redis::Client::open(cluster.urls()[0].as_str()).expect("client");
    support::a_cooldown_moves_a_slot_held_elsewhere(a, b, &node0).await;
}

#[tokio::test]
async fn a_cluster_connection_brought_by_the_caller() {
    let cluster = TestCluster::start().await;
    let urls = cluster.urls();
    let conn = redis::cluster::ClusterClient::new(urls.clone())
        .expect("client")
        .get_async_connection()
        .await
        .expect("cluster connection");
    let events = redis::Client::open(urls[1].as_str()).expect("client");
    let name = unique_name("byo-cluster");
    let store = RedisStore::from_cluster_connection(
        conn.clone(),
        Some(events),
        &name,
        RedisStoreOptions::new(),
    )
    .await
    .expect("store");
    assert!(store.is_cluster());
    let allowance = Allowance::with_store(
        AllowanceConfig::per_second(10, 1).expect("valid"),
        store.clone(),
    );
    allowance.acquire().await.expect("admitted");
    allowance.acquire().await.expect("admitted");
    assert_eq!(allowance.snapshot().waited, 1);
    // The application's own commands go over the same connection.
    let mut mine = conn;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(store.key())
        .query_async(&mut mine)
        .await
        .expect("EXISTS through the shared connection");
    assert_eq!(exists, 1);
    // Its blocking test connection reaches the cluster through the events client's node.
    store
        .follow_tokio_clock()
        .expect("a blocking cluster connection");
}

/// The public conformance suite on the cluster: stores over one cluster connection, each
/// check on a fresh allowance (in some slot, on some node) through a blocking cluster
/// connection.
#[test]
fn conformance_on_the_cluster() {
    let made = support::real().block_on(async {
        let cluster = TestCluster::start().await;
        let store = connect(&cluster, &unique_name("cluster-conf")).await;
        (cluster, store)
    });
    let (_cluster, base) = made;
    support::run_conformance(&base);
}
