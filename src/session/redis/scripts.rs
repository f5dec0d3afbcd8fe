//! The Lua scripts that read and change several keys in one step on the server: the lock's
//! release and renewal, the fenced record push, the conversations' LRU bound, the merge of what
//! was learned, forgetting a session and marking one for compaction.

/// Deletes the lock only when the caller still owns it.
pub(super) const RELEASE_LOCK: &str =
    r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) else return 0 end"#;

/// Extends the lock's lease only when the caller still owns it. ARGV: owner, lease in ms.
pub(super) const RENEW_LOCK: &str =
    r#"if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("PEXPIRE", KEYS[1], ARGV[2]) else return 0 end"#;

/// Appends a compaction record unless the list already ends with one of its generation or a
/// later one: the fencing of the compaction lock, so a holder whose lease lapsed while another
/// took over cannot lay a second record of the same generation over the winner's. KEYS[1]: the
/// record list; ARGV: the record's JSON, its generation, how many records are kept.
pub(super) const PUSH_RECORD: &str = r#"
local last = redis.call("LINDEX", KEYS[1], -1)
if last then
  local ok, record = pcall(cjson.decode, last)
  if ok and type(record) == "table" and tonumber(record.generation) and tonumber(record.generation) >= tonumber(ARGV[2]) then
    return 0
  end
end
redis.call("RPUSH", KEYS[1], ARGV[1])
redis.call("LTRIM", KEYS[1], -tonumber(ARGV[3]), -1)
return 1
"#;

/// Marks a conversation as just used and drops the least recently used ones beyond the bound,
/// with their keys, in the same step. KEYS[1]: the session's `conversations`; ARGV: the
/// conversation id, the bound, the TTL in seconds, the key prefix of conversations. Server time,
/// so replicas with different clocks still agree on the order. (The keys it deletes are not
/// declared: they share the session's hash tag, hence its Cluster slot.)
pub(super) const TOUCH_CONVERSATION: &str = r#"
local now = redis.call("TIME")
redis.call("ZADD", KEYS[1], now[1] * 1000000 + now[2], ARGV[1])
local excess = redis.call("ZCARD", KEYS[1]) - tonumber(ARGV[2])
if excess > 0 then
  for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, excess - 1)) do
    if id ~= ARGV[1] then
      local base = ARGV[4] .. id
      redis.call("DEL", base, base .. ":pruned", base .. ":compactions", base .. ":requests")
      redis.call("ZREM", KEYS[1], id)
    end
  end
end
redis.call("EXPIRE", KEYS[1], ARGV[3])
return 0
"#;

/// Merges what one request learned of its model into a session's (or a model's) hash, the rule
/// of [`Learned::merge`](crate::session::Learned::merge): another model's values are replaced;
/// the same model's are joined (the smallest named window and unnamed overflow, the largest
/// answer and output) and each calibration measurement is folded into the stored smoothing; an
/// overflow bound an answer contradicts is dropped. KEYS[1]: the hash; ARGV: model tag, window, window_below,
/// window_at_least, output_peak, the calibration the request started from, the calibration's
/// bounds, then the measurements. The tag is compared as text (a 64-bit hash is no Lua number);
/// every other value is far below 2^53.
pub(super) const MERGE_LEARNED: &str = r#"
local key = KEYS[1]
local function stored(field) return tonumber(redis.call("HGET", key, field) or "0") or 0 end
local function smallest_set(a, b)
  if a == 0 then return b elseif b == 0 then return a else return math.min(a, b) end
end
local window, below, least, peak, calibration
if redis.call("HGET", key, "model_tag") ~= ARGV[1] then
  window, below, least = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
  peak, calibration = tonumber(ARGV[5]), tonumber(ARGV[6])
else
  window = smallest_set(stored("learned_window"), tonumber(ARGV[2]))
  below = smallest_set(stored("window_below"), tonumber(ARGV[3]))
  least = math.max(stored("window_at_least"), tonumber(ARGV[4]))
  peak = math.max(stored("output_peak"), tonumber(ARGV[5]))
  calibration = stored("calibration_milli")
  if calibration == 0 then calibration = tonumber(ARGV[6]) end
end
local low, high = tonumber(ARGV[7]), tonumber(ARGV[8])
for i = 9, #ARGV do
  local observed = tonumber(ARGV[i])
  if calibration == 0 then
    calibration = observed
  else
    calibration = math.min(math.max(math.floor((calibration * 6 + observed * 4) / 10), low), high)
  end
end
if below > 0 and below <= least then below = 0 end
local function text(n) return string.format("%d", n) end
redis.call("HSET", key, "model_tag", ARGV[1], "learned_window", text(window), "window_below", text(below),
  "window_at_least", text(least), "calibration_milli", text(calibration), "output_peak", text(peak))
return 0
"#;

/// Deletes a whole session: every conversation the sorted set KEYS[1] lists (ARGV[1]: their key
/// prefix), then KEYS (the session's own keys and the previous layout's). Returns how many keys
/// went.
pub(super) const FORGET_SESSION: &str = r#"
local deleted = 0
for _, id in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
  local base = ARGV[1] .. id
  deleted = deleted + redis.call("DEL", base, base .. ":pruned", base .. ":compactions", base .. ":lock", base .. ":requests")
end
return deleted + redis.call("DEL", unpack(KEYS))
"#;

/// Sets the session's `compact_requested` when the session exists (its hash KEYS[1] or its
/// conversations KEYS[2]); 1 when it did, 0 (and nothing written) when not. ARGV[1]: the TTL.
pub(super) const REQUEST_COMPACTION: &str = r#"
if redis.call("EXISTS", KEYS[1], KEYS[2]) == 0 then return 0 end
redis.call("HSET", KEYS[1], "compact_requested", 1)
redis.call("EXPIRE", KEYS[1], ARGV[1])
return 1
"#;
