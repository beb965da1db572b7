//! Small shared facts the gateway polls rather than asks per request:
//! today, which breakers are open and until when.
//!
//! Each instance calls [`SharedFlags::sync_breakers`] a few times a second
//! with its own open breakers; one script publishes them (keeping the later
//! `until` of two) and returns everyone's, dropping expired entries. So a
//! breaker opened on one instance is open on all within one poll, and the
//! request path never waits on Redis for it.

use crate::RedisStore;
use loopgate_policy::StoreError;
use redis::Script;
use std::sync::Arc;

const SYNC: &str = r#"
-- KEYS: the breakers hash (key -> open-until ms). ARGV: now_ms, then pairs.
local now = tonumber(ARGV[1])
for i = 2, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i])) or 0
  if tonumber(ARGV[i + 1]) > cur then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
local all = redis.call('HGETALL', KEYS[1])
local out = {}
local latest = now
for i = 1, #all, 2 do
  local until_ms = tonumber(all[i + 1]) or 0
  if until_ms <= now then
    redis.call('HDEL', KEYS[1], all[i])
  else
    out[#out + 1] = all[i]
    out[#out + 1] = until_ms
    if until_ms > latest then latest = until_ms end
  end
end
-- Bounded: the hash lives only as long as its latest entry.
if #out > 0 then redis.call('PEXPIREAT', KEYS[1], latest + 1000) end
return out
"#;

#[derive(Debug, Clone)]
pub struct SharedFlags {
    store: RedisStore,
    key: String,
    script: Arc<Script>,
}

impl SharedFlags {
    pub fn new(store: RedisStore, key_prefix: &str) -> SharedFlags {
        SharedFlags {
            store,
            key: format!("{key_prefix}breakers"),
            script: Arc::new(Script::new(SYNC)),
        }
    }

    /// Publishes `open` (breaker key, open-until in epoch ms) and returns
    /// every instance's open breakers.
    pub async fn sync_breakers(
        &self,
        now_ms: u64,
        open: &[(String, u64)],
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let mut inv = self.script.prepare_invoke();
        inv.key(&self.key).arg(now_ms);
        for (k, until) in open {
            inv.arg(k).arg(*until);
        }
        let reply: Vec<redis::Value> = self
            .store
            .call(
                "breakers",
                |mut c| async move { inv.invoke_async(&mut c).await },
            )
            .await?;
        let mut out = Vec::with_capacity(reply.len() / 2);
        for pair in reply.chunks(2) {
            match pair {
                [redis::Value::BulkString(k), redis::Value::Int(u)] => {
                    out.push((String::from_utf8_lossy(k).into_owned(), (*u).max(0) as u64))
                }
                other => {
                    return Err(StoreError(format!(
                        "unexpected breaker reply from redis: {other:?}"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// Forgets a breaker everywhere (operator reset).
    pub async fn clear_breaker(&self, key: &str) -> Result<(), StoreError> {
        let (hash, field) = (self.key.clone(), key.to_string());
        self.store
            .call("breakers", |mut c| async move {
                redis::cmd("HDEL")
                    .arg(hash)
                    .arg(field)
                    .query_async::<i64>(&mut c)
                    .await
            })
            .await
            .map(|_| ())
    }
}
