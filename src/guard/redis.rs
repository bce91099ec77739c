//! `RedisGuard`: the production guard, shared by every handler instance.
//!
//! Each operation is one Lua script, so it is atomic on the server and costs
//! one round trip; scripts run on Redis 6 (Azure Cache for Redis). Connections
//! come from redis-rs' `ConnectionManager`, created lazily so the handler starts
//! while Redis is down, and reconnecting by itself when Redis returns.
//!
//! **Clusters.** With [`Topology::Cluster`] the connection is redis-rs' async
//! cluster client instead (also lazy): it learns the slot map from the node
//! it is given, follows `MOVED`/`ASK`, refreshes the map and reconnects after
//! a failover. The scripts are the same: an `EVAL` may run on a cluster when
//! all its keys are in one slot, and an order's two keys share its hash tag
//! (`orden:{id}`, `orden-fp:{id}`). A cache that answers as a cluster to the
//! plain client (`MOVED`, `CROSSSLOT`), or one that is not a cluster to the
//! cluster client, is named in one error-level log line with the setting to
//! change, once, and in every such operation's error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Script;

use super::entra::EntraCredentials;
use super::{
    classify_existing, Acquisition, GuardEntry, GuardError, GuardSettings, IdempotencyGuard, Token,
    COMPLETED,
};

/// SET NX EX of `PROCESANDO:<token>:<deadline ms>` (the deadline on the
/// server's clock: `TIME` + the lease); on failure, take over a reservation
/// whose owner's deadline has passed, or read the holder's value and the
/// completed fingerprint, all in the same script (keys cannot expire
/// mid-script). Replies `{1}` acquired, `{2, old}` taken over, `{0, value,
/// fingerprint}` held. `replicate_commands` lets Redis 6 write after `TIME`
/// (effects replication; the default, and a no-op, from Redis 7).
/// ARGV: token value, processing TTL (s), lease (ms).
const ACQUIRE: &str = r"
redis.replicate_commands()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local value = ARGV[1] .. ':' .. (now + tonumber(ARGV[3]))
if redis.call('SET', KEYS[1], value, 'NX', 'EX', ARGV[2]) then
  return {1, false, false}
end
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, 1, 11) == 'PROCESANDO:' then
  local deadline = tonumber(string.match(held, '^PROCESANDO:[^:]+:(%d+)$'))
  if deadline and deadline < now then
    redis.call('SET', KEYS[1], value, 'EX', ARGV[2])
    return {2, held, false}
  end
end
return {0, held, redis.call('GET', KEYS[2])}
";

const COMPLETE: &str = r"
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
return 1
";

/// Compare-and-delete: never delete another worker's reservation. The
/// value is ours when it is our token, followed by our deadline (or by
/// nothing: a reservation made before deadlines were stored).
const RELEASE: &str = r"
local v = redis.call('GET', KEYS[1])
if v and (v == ARGV[1] or string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ':') then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Compare-and-renew: only the owner may extend its reservation, which moves
/// its deadline (server time + lease) and its TTL.
/// ARGV: token value, processing TTL (s), lease (ms).
const EXTEND: &str = r"
local v = redis.call('GET', KEYS[1])
if v and (v == ARGV[1] or string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. ':') then
  redis.replicate_commands()
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('SET', KEYS[1], ARGV[1] .. ':' .. (now + tonumber(ARGV[3])), 'EX', ARGV[2])
  return 1
end
return 0
";

/// Compare-and-delete of a completed order's two keys: only if the guard
/// key is still `COMPLETADA` and the marker is still ARGV[1] ('' = none).
const FORGET: &str = r"
if redis.call('GET', KEYS[1]) == 'COMPLETADA' and (redis.call('GET', KEYS[2]) or '') == ARGV[1] then
  return redis.call('DEL', KEYS[1], KEYS[2])
end
return 0
";

const INSPECT: &str = r"
return {redis.call('GET', KEYS[1]), redis.call('TTL', KEYS[1]), redis.call('GET', KEYS[2])}
";

/// How the cache is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// One endpoint: a single node, a replicated pair behind one address, or
    /// a proxy cluster that hides its shards (Azure's Enterprise cluster
    /// policy). `REDIS_CLUSTER=false`.
    Single,
    /// An OSS-protocol cluster (`CLUSTER SLOTS`, `MOVED`): the URL names one
    /// node, the others are found from it. `REDIS_CLUSTER=true`.
    Cluster,
}

/// The connection: one endpoint, or a cluster. Both are cheap to clone
/// (handles on one multiplexed connection, or on the cluster's).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Redis-backed guard.
pub struct RedisGuard {
    settings: GuardSettings,
    conn: Conn,
    topology: Topology,
    /// `host:port` of the URL, for messages (never the credentials).
    endpoint: String,
    /// The topology mismatch has been logged (once per process).
    mismatch_logged: AtomicBool,
    timeout: Duration,
    acquire: Script,
    complete: Script,
    release: Script,
    extend: Script,
    inspect: Script,
    forget: Script,
}

impl RedisGuard {
    /// A guard on `url` (`redis://` or `rediss://`). Does not connect yet: the
    /// first operation does, and a Redis that is down only makes operations
    /// answer `Unavailable` until it is back. `timeout` bounds every operation.
    pub fn new(
        url: &str,
        settings: GuardSettings,
        timeout: Duration,
    ) -> Result<RedisGuard, GuardError> {
        RedisGuard::with_topology(url, Topology::Single, settings, timeout)
    }

    /// A guard on `url` reached as `topology` says; a cluster's URL names
    /// any one of its nodes. Lazy like [`RedisGuard::new`]; must be called
    /// inside a tokio runtime (the cluster client spawns its task).
    pub fn with_topology(
        url: &str,
        topology: Topology,
        settings: GuardSettings,
        timeout: Duration,
    ) -> Result<RedisGuard, GuardError> {
        RedisGuard::connect(url, topology, None, settings, timeout)
    }

    /// [`RedisGuard::with_topology`], authenticating with Entra ID tokens
    /// when `entra` is given (the URL then carries no password), every live
    /// connection re-authenticated as tokens rotate.
    pub fn connect(
        url: &str,
        topology: Topology,
        entra: Option<EntraCredentials>,
        settings: GuardSettings,
        timeout: Duration,
    ) -> Result<RedisGuard, GuardError> {
        let client =
            redis::Client::open(url).map_err(|e| GuardError(format!("invalid Redis URL: {e}")))?;
        let endpoint = client.get_connection_info().addr().to_string();
        let conn = match topology {
            Topology::Single => {
                let mut config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                if let Some(entra) = entra {
                    config = config.set_credentials_provider(entra);
                }
                Conn::Single(
                    ConnectionManager::new_lazy_with_config(client, config).map_err(|e| {
                        GuardError(format!("cannot set up the Redis connection: {e}"))
                    })?,
                )
            }
            Topology::Cluster => {
                // redis-rs' defaults wait 1.28 s or more before a retry,
                // longer than a guard call may take: retry soon, few times,
                // and let our timeout bound the whole call.
                let mut builder =
                    ClusterClientBuilder::new(vec![client.get_connection_info().clone()])
                        .connection_timeout(timeout)
                        .response_timeout(timeout)
                        .retries(3)
                        .min_retry_wait(10)
                        .max_retry_wait(timeout.as_millis().clamp(20, 500) as u64);
                if let Some(entra) = entra {
                    builder = builder.set_credentials_provider(entra);
                }
                let client = builder
                    .build()
                    .map_err(|e| GuardError(format!("invalid Redis cluster settings: {e}")))?;
                Conn::Cluster(
                    client.get_pending_async_connection_with_config(
                        redis::cluster::ClusterConfig::new()
                            .set_connection_timeout(timeout)
                            .set_response_timeout(timeout),
                    ),
                )
            }
        };
        Ok(RedisGuard {
            settings,
            conn,
            topology,
            endpoint,
            mismatch_logged: AtomicBool::new(false),
            timeout,
            acquire: Script::new(ACQUIRE),
            complete: Script::new(COMPLETE),
            release: Script::new(RELEASE),
            extend: Script::new(EXTEND),
            inspect: Script::new(INSPECT),
            forget: Script::new(FORGET),
        })
    }

    /// The lease in milliseconds, never past the processing TTL.
    fn lease_ms(&self) -> String {
        self.settings
            .lease
            .min(self.settings.processing_ttl)
            .as_millis()
            .to_string()
    }

    /// Run `script` on the order's two keys with `args`, bounded by the timeout.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        order_id: &str,
        args: &[&str],
    ) -> Result<T, GuardError> {
        let mut invocation = script.prepare_invoke();
        invocation
            .key(self.settings.key(order_id))
            .key(self.settings.fingerprint_key(order_id));
        for a in args {
            invocation.arg(*a);
        }
        let mut conn = self.conn.clone();
        match tokio::time::timeout(self.timeout, invocation.invoke_async(&mut conn)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.error(e)),
            Err(_) => Err(GuardError(format!(
                "Redis did not answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }

    /// A Redis error as a guard error; a topology mismatch is said plainly,
    /// and logged at error level the first time.
    fn error(&self, e: redis::RedisError) -> GuardError {
        match self.mismatch(&e) {
            Some(hint) => {
                if !self.mismatch_logged.swap(true, Ordering::Relaxed) {
                    log::error!("{hint}");
                }
                GuardError(format!("{hint} (Redis answered: {e})"))
            }
            None => GuardError(e.to_string()),
        }
    }

    /// What to change, when `e` says the cache is not what `REDIS_CLUSTER`
    /// says: `MOVED`/`ASK`/`CROSSSLOT` to the plain client, or "cluster
    /// support disabled" to the cluster client.
    fn mismatch(&self, e: &redis::RedisError) -> Option<String> {
        use redis::{ErrorKind, ServerErrorKind};
        match self.topology {
            Topology::Single => matches!(
                e.kind(),
                ErrorKind::Server(
                    ServerErrorKind::Moved | ServerErrorKind::Ask | ServerErrorKind::CrossSlot
                )
            )
            .then(|| self.is_a_cluster()),
            Topology::Cluster => e
                .to_string()
                .to_ascii_lowercase()
                .contains("cluster support disabled")
                .then(|| self.is_not_a_cluster()),
        }
    }

    fn is_a_cluster(&self) -> String {
        format!(
            "the Redis at {} is a cluster (OSS cluster protocol: it redirects keys to other nodes), and REDIS_CLUSTER is not true: set REDIS_CLUSTER=true; until then the guard cannot work",
            self.endpoint
        )
    }

    fn is_not_a_cluster(&self) -> String {
        format!(
            "the Redis at {} is not a cluster (cluster support disabled), and REDIS_CLUSTER=true: set REDIS_CLUSTER=false; until then the guard cannot work",
            self.endpoint
        )
    }

    /// Ask the cache whether it is what `REDIS_CLUSTER` says (`INFO
    /// cluster`: `cluster_enabled:1` only on an OSS-protocol cluster node; a
    /// proxy cluster answers 0, correctly, since it takes every key).
    /// `Err` with the setting to change on a mismatch (also logged, once);
    /// `Ok(None)` when it matches; `Ok(Some(why))` when the cache did not
    /// answer (it is checked again by the first operation's errors).
    pub async fn check_topology(&self) -> Result<Option<String>, GuardError> {
        let mut conn = self.conn.clone();
        let mut cmd = redis::cmd("INFO");
        cmd.arg("cluster");
        let answer = match &mut conn {
            Conn::Single(c) => {
                tokio::time::timeout(self.timeout, cmd.query_async::<String>(c)).await
            }
            Conn::Cluster(c) => {
                // Any one node: they all answer alike.
                let routed =
                    c.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random));
                tokio::time::timeout(self.timeout, async {
                    redis::from_redis_value::<String>(routed.await?)
                        .map_err(redis::RedisError::from)
                })
                .await
            }
        };
        let text = match answer {
            Ok(Ok(text)) => text,
            Ok(Err(e)) => {
                let e = self.error(e);
                return match self.mismatch_logged.load(Ordering::Relaxed) {
                    true => Err(e),
                    false => Ok(Some(e.0)),
                };
            }
            Err(_) => {
                return Ok(Some(format!(
                    "Redis did not answer within {} ms",
                    self.timeout.as_millis()
                )))
            }
        };
        let clustered = text.lines().any(|l| l.trim() == "cluster_enabled:1");
        let hint = match (self.topology, clustered) {
            (Topology::Single, true) => self.is_a_cluster(),
            (Topology::Cluster, false) => self.is_not_a_cluster(),
            _ => return Ok(None),
        };
        if !self.mismatch_logged.swap(true, Ordering::Relaxed) {
            log::error!("{hint}");
        }
        Err(GuardError(hint))
    }

    /// The nodes that hold slots (the masters), as `(host, port)`, from
    /// `CLUSTER SLOTS` (the names the cluster client routes by).
    async fn cluster_masters(
        &self,
        conn: &mut ClusterConnection,
    ) -> Result<Vec<(String, u16)>, GuardError> {
        let slots = tokio::time::timeout(
            self.timeout,
            conn.route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            ),
        )
        .await
        .map_err(|_| GuardError("CLUSTER SLOTS: no answer in time".into()))?
        .map_err(|e| self.error(e))?;
        let ranges: Vec<Vec<redis::Value>> = redis::from_redis_value(slots)
            .map_err(|e| GuardError(format!("CLUSTER SLOTS: {e}")))?;
        let mut masters = Vec::new();
        for range in ranges {
            // [start, end, [host, port, id, …] (the master), replicas…]
            let master: Vec<redis::Value> = match range.get(2) {
                Some(v) => redis::from_redis_value(v.clone())
                    .map_err(|e| GuardError(format!("CLUSTER SLOTS: {e}")))?,
                None => continue,
            };
            let (Some(host), Some(port)) = (master.first(), master.get(1)) else {
                continue;
            };
            let host: String = redis::from_redis_value(host.clone())
                .map_err(|e| GuardError(format!("CLUSTER SLOTS: {e}")))?;
            let port: u16 = redis::from_redis_value(port.clone())
                .map_err(|e| GuardError(format!("CLUSTER SLOTS: {e}")))?;
            if !masters.contains(&(host.clone(), port)) {
                masters.push((host, port));
            }
        }
        Ok(masters)
    }

    /// Every key matching `pattern`: `SCAN` on the one endpoint, or on every
    /// master of a cluster (each holds its own slots' keys).
    async fn scan_keys(&self, pattern: &str) -> Result<Vec<String>, GuardError> {
        let mut conn = self.conn.clone();
        let nodes = match &mut conn {
            Conn::Single(_) => vec![None],
            Conn::Cluster(c) => self
                .cluster_masters(c)
                .await?
                .into_iter()
                .map(Some)
                .collect(),
        };
        let mut keys = Vec::new();
        for node in nodes {
            let mut cursor = 0u64;
            loop {
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(1000);
                let page = match (&mut conn, &node) {
                    (Conn::Cluster(c), Some((host, port))) => {
                        let routed = c.route_command(
                            cmd,
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                                host: host.clone(),
                                port: *port,
                            }),
                        );
                        tokio::time::timeout(self.timeout, routed)
                            .await
                            .map(|r| r.and_then(|v| Ok(redis::from_redis_value(v)?)))
                    }
                    (c, _) => tokio::time::timeout(self.timeout, cmd.query_async(c)).await,
                };
                let (next, page): (u64, Vec<String>) = page
                    .map_err(|_| GuardError("SCAN: no answer in time".into()))?
                    .map_err(|e| self.error(e))?;
                keys.extend(page);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        keys.sort();
        keys.dedup(); // SCAN may return a key twice
        Ok(keys)
    }

    /// An acquire that timed out may still run: a hung Redis (paused, stuck
    /// on a slow command) executes the queued script when it resumes, and
    /// would leave a reservation nobody owns, so every redelivery would be
    /// `in_progress` for the whole processing TTL. Queue a compare-and-delete
    /// of our token right behind it: a timeout does not drop the connection,
    /// so Redis runs the two in order and the stray reservation is removed
    /// the moment it appears. Harmless when the acquire never ran.
    ///
    /// Sent as a plain `EVAL`, not `EVALSHA`: a `NOSCRIPT` answer would make
    /// the client load the script and send it again *after* whatever was
    /// queued meanwhile (e.g. the redelivery's own acquire).
    fn disown(&self, order_id: &str, token: &Token) -> Disown {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(RELEASE)
            .arg(2)
            .arg(self.settings.key(order_id))
            .arg(self.settings.fingerprint_key(order_id))
            .arg(token.value());
        Disown {
            cmd: Some(cmd),
            conn: self.conn.clone(),
            bound: self.settings.processing_ttl,
        }
    }
}

/// The compare-and-delete of an acquire's token, sent unless the acquire's
/// answer came back ([`Disown::answered`]). Sent on drop, so an acquire whose
/// future is dropped half-way (the event's deadline, a cancelled invocation)
/// is disowned exactly like one that timed out.
struct Disown {
    cmd: Option<redis::Cmd>,
    conn: Conn,
    bound: Duration,
}

impl Disown {
    /// The acquire's answer arrived: nothing to disown.
    fn answered(mut self) {
        self.cmd = None;
    }
}

impl Drop for Disown {
    fn drop(&mut self) {
        let Some(cmd) = self.cmd.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // shutting down: the reservation expires by its TTL
        };
        let (mut conn, bound) = (self.conn.clone(), self.bound);
        runtime.spawn(async move {
            // Only sending it matters; the answer may never come.
            let _ = tokio::time::timeout(bound, cmd.query_async::<i64>(&mut conn)).await;
        });
    }
}

#[async_trait]
impl IdempotencyGuard for RedisGuard {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn preflight(&self) -> Result<(), GuardError> {
        match self.check_topology().await? {
            None => Ok(()),
            Some(why) => {
                log::warn!(
                    "could not ask the Redis at {} whether it is a cluster ({why}); its first answers will tell",
                    self.endpoint
                );
                Ok(())
            }
        }
    }

    async fn acquire(&self, order_id: &str) -> Acquisition {
        let token = Token::new();
        let ttl = self.settings.processing_ttl.as_secs().max(1).to_string();
        let lease = self.lease_ms();
        // Armed before the script is sent: if this future is dropped or the
        // call fails, the token is disowned.
        let disown = self.disown(order_id, &token);
        let reply: Result<(i64, Option<String>, Option<String>), GuardError> = self
            .run(&self.acquire, order_id, &[&token.value(), &ttl, &lease])
            .await;
        match reply {
            Ok((1, _, _)) => {
                disown.answered();
                Acquisition::Acquired(token)
            }
            Ok((2, _, _)) => {
                disown.answered();
                Acquisition::TakenOver(token)
            }
            Ok((_, value, fingerprint)) => {
                disown.answered();
                classify_existing(value, fingerprint)
            }
            Err(e) => {
                drop(disown);
                Acquisition::Unavailable(e.0)
            }
        }
    }

    async fn complete(&self, order_id: &str, fingerprint: &str) -> Result<(), GuardError> {
        let ttl = self.settings.completed_ttl.as_secs().max(1).to_string();
        self.run::<i64>(&self.complete, order_id, &[COMPLETED, fingerprint, &ttl])
            .await
            .map(|_| ())
    }

    async fn release(&self, order_id: &str, token: &Token) -> Result<bool, GuardError> {
        self.run::<i64>(&self.release, order_id, &[&token.value()])
            .await
            .map(|n| n == 1)
    }

    async fn extend(&self, order_id: &str, token: &Token) -> Result<bool, GuardError> {
        let ttl = self.settings.processing_ttl.as_secs().max(1).to_string();
        let lease = self.lease_ms();
        self.run::<i64>(&self.extend, order_id, &[&token.value(), &ttl, &lease])
            .await
            .map(|n| n == 1)
    }

    async fn completed_orders(&self) -> Result<Vec<(String, Option<String>)>, GuardError> {
        let pattern = format!("{}*", glob_escape(&self.settings.prefix));
        let mut completed = Vec::new();
        for key in self.scan_keys(&pattern).await? {
            // Keys of the format before hash tags (`orden:<id>`) are not
            // listed: they expire within the completed TTL.
            let Some(order_id) = self.settings.order_id_of(&key) else {
                continue;
            };
            let entry = self.inspect(&order_id).await?;
            if entry.value.as_deref() == Some(COMPLETED) {
                completed.push((order_id, entry.fingerprint));
            }
        }
        Ok(completed)
    }

    async fn forget_completed(
        &self,
        order_id: &str,
        marker: Option<&str>,
    ) -> Result<bool, GuardError> {
        self.run::<i64>(&self.forget, order_id, &[marker.unwrap_or("")])
            .await
            .map(|n| n > 0)
    }

    async fn inspect(&self, order_id: &str) -> Result<GuardEntry, GuardError> {
        let (value, ttl, fingerprint): (Option<String>, i64, Option<String>) =
            self.run(&self.inspect, order_id, &[]).await?;
        Ok(GuardEntry {
            ttl_seconds: value.as_ref().map(|_| ttl),
            value,
            fingerprint,
        })
    }
}

/// `s` with Redis glob metacharacters escaped, for `SCAN MATCH`.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::glob_escape;

    /// `SCAN MATCH` takes a glob: a key prefix holding `*`, `?`, `[`, `]`
    /// or `\` must match only itself (the listing filters by the literal
    /// prefix too, so without this it would only scan more keys).
    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(glob_escape("orden:"), "orden:");
        assert_eq!(glob_escape(r"a*b?c[d]e\f"), r"a\*b\?c\[d\]e\\f");
        assert_eq!(glob_escape(""), "");
    }
}
