//! `RedisGuard`: the production guard, shared by every handler instance.
//!
//! Each operation is one Lua script, so it is atomic on the server and costs
//! one round trip; scripts run on Redis 6 (Azure Cache for Redis). Connections
//! come from redis-rs' `ConnectionManager`, created lazily so the handler starts
//! while Redis is down, and reconnecting by itself when Redis returns.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

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

/// Redis-backed guard.
pub struct RedisGuard {
    settings: GuardSettings,
    conn: ConnectionManager,
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
        let client =
            redis::Client::open(url).map_err(|e| GuardError(format!("invalid Redis URL: {e}")))?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| GuardError(format!("cannot set up the Redis connection: {e}")))?;
        Ok(RedisGuard {
            settings,
            conn,
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
            Ok(Err(e)) => Err(GuardError(e.to_string())),
            Err(_) => Err(GuardError(format!(
                "Redis did not answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
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
    conn: ConnectionManager,
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
        use futures::StreamExt;
        let pattern = format!("{}*", glob_escape(&self.settings.prefix));
        let mut conn = self.conn.clone();
        let keys: Vec<String> = {
            let iter = redis::AsyncCommands::scan_match::<_, String>(&mut conn, pattern)
                .await
                .map_err(|e| GuardError(e.to_string()))?;
            iter.collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<Result<_, _>>()
                .map_err(|e| GuardError(e.to_string()))?
        };
        let mut completed = Vec::new();
        for key in keys {
            let Some(order_id) = key.strip_prefix(&self.settings.prefix) else {
                continue;
            };
            let entry = self.inspect(order_id).await?;
            if entry.value.as_deref() == Some(COMPLETED) {
                completed.push((order_id.to_string(), entry.fingerprint));
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
