//! A throwaway Redis Cluster: six `redis-server --cluster-enabled yes` on loopback, joined by
//! `redis-cli --cluster create --cluster-replicas 1` into three masters with a replica each.
//!
//! The nodes use a short `cluster-node-timeout` (1 s) so that a killed master is replaced
//! within seconds, and `cluster-require-full-coverage no`, the setting the README recommends:
//! while one shard is between masters the other two keep serving. [`RedisCluster::failover`]
//! is the coordinated hand-over (`CLUSTER FAILOVER` on a replica, as in maintenance);
//! [`RedisCluster::kill`] is a crash, after which the replica takes over by election.
//!
//! [`RedisCluster::start_tls`] is the same cluster over TLS only: every node as
//! [`RedisServer::start_tls`] makes one, on one CA, with `tls-cluster yes` (the bus) and
//! `tls-replication yes`; its URL is `rediss-cluster://USER:PASSWORD@…`.

use std::fmt;
use std::time::Duration;

use tokio::process::Command;

use crate::gateway::unique_name;
use crate::redis::{command, Access, RedisServer, Reply, SharedRedis, TLS_USER};
use crate::server::free_port;
use crate::tls::TlsFiles;

const MASTERS: usize = 3;
/// How long the cluster may take to agree on its shape after a change.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_REDIRECTS: usize = 5;

pub struct RedisCluster {
    /// Every node, masters and replicas; which is which changes with failovers.
    pub nodes: Vec<RedisServer>,
    access: Access,
}

/// Inclusive slot ranges, as `CLUSTER NODES` lists them.
type Slots = Vec<(u16, u16)>;

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
struct NodeLine {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    master_id: String,
    slots: Slots,
}

fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let port = f[1].split('@').next()?.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeLine {
                id: f[0].to_string(),
                port,
                master: flags.contains(&"master"),
                failed: flags.iter().any(|fl| fl.starts_with("fail")),
                master_id: f[3].to_string(),
                slots,
            })
        })
        .collect()
}

impl RedisCluster {
    /// Starts six nodes, creates the cluster and waits until every node sees it whole and
    /// every replica is in sync with its master.
    pub async fn start() -> RedisCluster {
        Self::start_on(Access::default()).await
    }

    /// [`RedisCluster::start`] over TLS only (see the module's doc).
    pub async fn start_tls() -> RedisCluster {
        let dir = std::env::temp_dir().join(unique_name("e2e-redis-cluster-ca"));
        Self::start_on(Access::tls(TlsFiles::make(&dir))).await
    }

    async fn start_on(access: Access) -> RedisCluster {
        let tls = access.files().is_some();
        let starts = (0..MASTERS * 2).map(|_| {
            RedisServer::start_on(access.clone(), move || {
                let mut args: Vec<String> = vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-config-file".into(),
                    "nodes.conf".into(),
                    "--cluster-port".into(),
                    free_port().to_string(),
                    "--cluster-node-timeout".into(),
                    "1000".into(),
                    "--cluster-require-full-coverage".into(),
                    "no".into(),
                    // A replica whose link broke a moment ago may still be elected.
                    "--cluster-replica-validity-factor".into(),
                    "0".into(),
                    "--repl-diskless-sync-delay".into(),
                    "0".into(),
                ];
                if tls {
                    args.extend(["--tls-cluster".into(), "yes".into()]);
                }
                args
            })
        });
        let cluster = RedisCluster {
            nodes: futures::future::join_all(starts).await,
            access,
        };
        let mut create = Command::new("redis-cli");
        if let Some(files) = cluster.access.files() {
            create
                .arg("--tls")
                .arg("--cacert")
                .arg(&files.ca)
                .arg("--cert")
                .arg(&files.client_cert)
                .arg("--key")
                .arg(&files.client_key)
                .args([
                    "--user",
                    TLS_USER.0,
                    "--pass",
                    TLS_USER.1,
                    "--no-auth-warning",
                ]);
        }
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        create.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = create
            .output()
            .await
            .unwrap_or_else(|e| panic!("cannot run redis-cli (apt-get install redis-tools): {e}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_settled().await;
        cluster
    }

    /// Indexes (into [`nodes`](Self::nodes)) of the running nodes.
    fn running(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.nodes[i].is_running())
    }

    fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// `CLUSTER NODES` as a running node sees it.
    async fn view(&self, node: usize) -> Result<Vec<NodeLine>, String> {
        match command(&self.access, self.nodes[node].port, &["CLUSTER", "NODES"]).await? {
            Reply::Bulk(Some(text)) => Ok(parse_nodes(&text)),
            other => Err(format!("CLUSTER NODES answered {other:?}")),
        }
    }

    /// Whether every running node reports `cluster_state:ok`, agrees on one live master per
    /// shard covering every slot, and every replica of a live master is in sync.
    async fn settled(&self) -> bool {
        let mut masters: Option<Vec<(u16, Slots)>> = None;
        for i in self.running() {
            let Ok(Reply::Bulk(Some(info))) =
                command(&self.access, self.nodes[i].port, &["CLUSTER", "INFO"]).await
            else {
                return false;
            };
            if !info.contains("cluster_state:ok") {
                return false;
            }
            let Ok(view) = self.view(i).await else {
                return false;
            };
            let mut live: Vec<(u16, Slots)> = view
                .iter()
                .filter(|n| n.master && !n.failed && !n.slots.is_empty())
                .map(|n| (n.port, n.slots.clone()))
                .collect();
            live.sort();
            let covered: u32 = live
                .iter()
                .flat_map(|(_, s)| s.iter().map(|(a, b)| u32::from(b - a) + 1))
                .sum();
            if live.len() != MASTERS || covered != 16_384 {
                return false;
            }
            match &masters {
                Some(m) if *m != live => return false,
                _ => masters = Some(live),
            }
            let Ok(Reply::Bulk(Some(replication))) =
                command(&self.access, self.nodes[i].port, &["INFO", "replication"]).await
            else {
                return false;
            };
            if replication.contains("role:slave")
                && !(replication.contains("master_link_status:up")
                    && replication.contains("master_sync_in_progress:0"))
            {
                return false;
            }
        }
        true
    }

    /// Waits until the cluster is whole again (see `settled`) after a change.
    pub async fn wait_settled(&self) {
        crate::poll_until(
            "the Redis Cluster to settle (cluster_state ok, three live masters, replicas in sync)",
            SETTLE_TIMEOUT,
            Duration::from_millis(100),
            || async { self.settled().await.then_some(()) },
        )
        .await;
    }

    /// The node serving `key` (the master of its slot, as the running nodes see it).
    pub async fn master_of(&self, key: &str) -> usize {
        let slot = self
            .cmd(&["CLUSTER", "KEYSLOT", key])
            .await
            .as_i64()
            .expect("CLUSTER KEYSLOT answers an integer");
        for i in self.running() {
            if let Ok(view) = self.view(i).await {
                if let Some(master) = view.iter().find(|n| {
                    n.master
                        && !n.failed
                        && n.slots
                            .iter()
                            .any(|&(a, b)| (i64::from(a)..=i64::from(b)).contains(&slot))
                }) {
                    return self.index_of_port(master.port);
                }
            }
        }
        panic!("no live master serves slot {slot} ({key})\n{}", self.logs());
    }

    /// The replica of the master at `master`.
    pub async fn replica_of(&self, master: usize) -> usize {
        let view = self
            .view(master)
            .await
            .unwrap_or_else(|e| panic!("node {master}: {e}"));
        let id = &view
            .iter()
            .find(|n| n.port == self.nodes[master].port)
            .expect("a node lists itself")
            .id;
        let replica = view
            .iter()
            .find(|n| !n.master && !n.failed && &n.master_id == id)
            .unwrap_or_else(|| panic!("master {master} has no live replica: {view:?}"));
        self.index_of_port(replica.port)
    }

    /// `CLUSTER FAILOVER` on `replica`: its master stops taking writes, the replica catches up
    /// and takes over. Returns once the cluster has settled with `replica` as master.
    pub async fn failover(&self, replica: usize) {
        let reply = command(
            &self.access,
            self.nodes[replica].port,
            &["CLUSTER", "FAILOVER"],
        )
        .await
        .unwrap_or_else(|e| panic!("CLUSTER FAILOVER on node {replica}: {e}"));
        assert_eq!(reply, Reply::Simple("OK".into()), "CLUSTER FAILOVER");
        crate::poll_until(
            &format!("node {replica} to be a master after CLUSTER FAILOVER"),
            SETTLE_TIMEOUT,
            Duration::from_millis(50),
            || async {
                match command(&self.access, self.nodes[replica].port, &["ROLE"]).await {
                    Ok(Reply::Array(role))
                        if role.first() == Some(&Reply::Bulk(Some("master".into()))) =>
                    {
                        Some(())
                    }
                    _ => None,
                }
            },
        )
        .await;
        self.wait_settled().await;
    }

    /// SIGKILL of `node`: a crash. Its replica is elected after about the node timeout.
    pub async fn kill(&mut self, node: usize) {
        self.nodes[node].kill().await;
    }

    /// Starts a killed node again on its port with its `nodes.conf`: it rejoins as a replica of
    /// whoever took its slots. Returns once the cluster has settled.
    pub async fn restart(&mut self, node: usize) {
        self.nodes[node].restart().await;
        self.wait_settled().await;
    }
}

impl SharedRedis for RedisCluster {
    /// `redis-cluster://` with every node as a seed, so a pod starting while one is down
    /// still finds the others.
    fn url(&self) -> String {
        let mut url = self.access.url("redis-cluster", self.nodes[0].port);
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            url.push(if i == 1 { '?' } else { '&' });
            url.push_str(&format!("node=127.0.0.1:{}", node.port));
        }
        url
    }

    fn tls_flags(&self) -> Vec<String> {
        self.access.flags()
    }

    fn logs(&self) -> String {
        self.nodes
            .iter()
            .enumerate()
            .map(|(i, n)| format!("----- node {i} (port {}) -----\n{}\n", n.port, n.logs()))
            .collect()
    }

    /// Sends to the first running node and follows `MOVED` / `ASK` to the node serving the key,
    /// as a cluster client does.
    async fn command(&self, args: &[&str]) -> Result<Reply, String> {
        let mut last = String::from("no running node");
        for start in self.running() {
            let mut port = self.nodes[start].port;
            let mut asking = false;
            for _ in 0..MAX_REDIRECTS {
                if asking {
                    command(&self.access, port, &["ASKING"]).await?;
                }
                let reply = match command(&self.access, port, args).await {
                    Ok(reply) => reply,
                    Err(e) => {
                        last = e;
                        break;
                    }
                };
                let Reply::Error(e) = &reply else {
                    return Ok(reply);
                };
                let redirect = e
                    .strip_prefix("MOVED ")
                    .map(|r| (r, false))
                    .or_else(|| e.strip_prefix("ASK ").map(|r| (r, true)));
                let Some((target, ask)) = redirect else {
                    return Ok(reply);
                };
                port = target
                    .rsplit(':')
                    .next()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| format!("bad redirect {e:?}"))?;
                asking = ask;
                last = e.clone();
            }
        }
        Err(format!("redis cluster {args:?}: {last}"))
    }
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisCluster({})", self.url())
    }
}
