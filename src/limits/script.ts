/**
 * The Redis side of the limiter: Lua run atomically by Redis, so the read,
 * the all-or-nothing decision and the write of every rule in one acquire
 * happen with no other client in between. The formulas repeat gcra.ts and
 * log.ts exactly (integers in doubles, no fractions stored); the contract
 * suite and a differential property test keep them in step.
 *
 * Keys per rule (two each, so KEYS[2i-1], KEYS[2i] belong to rule i):
 * - burst: `<prefix>b:<key>` = "tatMs:tatRem:den" (string, PX = until TAT);
 *   the second key is unused.
 * - window / sum: `<prefix>w:<key>` / `<prefix>s:<key>` = list of "q:n",
 *   oldest first, and `<prefix>wt:<key>` / `<prefix>st:<key>` = the list's
 *   total (kept so a check is O(1), not a walk). Both expire when the newest
 *   entry does. If the total is missing while the list is not (e.g. evicted
 *   under maxmemory), it is recomputed from the list.
 */
import { MAX_LOG_ENTRIES } from './log.js';

const COMMON = `
local now = tonumber(ARGV[1])
local MAX = ${MAX_LOG_ENTRIES}

local function fmt(x) return string.format('%.17g', x) end

local function pair(e)
  local c = string.find(e, ':', 1, true)
  return tonumber(string.sub(e, 1, c - 1)), tonumber(string.sub(e, c + 1))
end

-- Drops entries whose bucket ended a window ago. Returns total, newest q,
-- newest n, and whether the stored total is stale (the caller writes it once,
-- through record() or settle()).
local function prune(lk, tk, w)
  local raw = redis.call('GET', tk)
  local total = 0
  if raw then
    total = tonumber(raw)
  else
    local es = redis.call('LRANGE', lk, 0, -1)
    for j = 1, #es do
      local _, n = pair(es[j])
      total = total + n
    end
  end
  local cut = now - w
  local stale = not raw
  while true do
    local e = redis.call('LINDEX', lk, 0)
    if not e then break end
    local q, n = pair(e)
    if q > cut then break end
    redis.call('LPOP', lk)
    total = total - n
    stale = true
  end
  local e = redis.call('LINDEX', lk, -1)
  if not e then
    if raw then redis.call('DEL', tk) end
    return 0, nil, nil, false
  end
  local q, n = pair(e)
  return total, q, n, stale
end

-- Writes a stale total with the list's expiry (when its newest entry ends).
local function settle(tk, total, lastq, stale, w)
  if stale then redis.call('SET', tk, fmt(total), 'PX', lastq + w - now) end
end

-- Counts n in bucket q (merged into the newest entry when it is that bucket).
local function record(lk, tk, total, lastq, lastn, q, n, w)
  if lastq and lastq >= q then
    q = lastq
    redis.call('LSET', lk, -1, fmt(q) .. ':' .. fmt(lastn + n))
  else
    redis.call('RPUSH', lk, fmt(q) .. ':' .. fmt(n))
  end
  local ttl = q + w - now
  redis.call('PEXPIRE', lk, ttl)
  redis.call('SET', tk, fmt(total + n), 'PX', ttl)
  return q
end

local function bucket(g, lastq)
  local q = math.ceil(now / g) * g
  if lastq and lastq > q then return lastq end
  return q
end
`;

/**
 * ARGV: now, then per rule: kind ('b' | 'w' | 's'), limit, burst (0 unless
 * 'b'), windowMs. Returns per rule: allowed (1 | 0), limit, remaining,
 * resetMs, retryAfterMs.
 */
export const ACQUIRE_LUA = `${COMMON}
local nrules = (#ARGV - 1) / 4
local st = {}
local all = true

for i = 1, nrules do
  local a = 1 + (i - 1) * 4
  local kind, limit, burst, w = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  if kind == 'b' then
    local debt = 0
    local s = redis.call('GET', KEYS[2 * i - 1])
    if s then
      local c1 = string.find(s, ':', 1, true)
      local c2 = string.find(s, ':', c1 + 1, true)
      local ms = tonumber(string.sub(s, 1, c1 - 1))
      local rem = tonumber(string.sub(s, c1 + 1, c2 - 1))
      if tonumber(string.sub(s, c2 + 1)) ~= limit then
        if rem > 0 then ms = ms + 1 end
        rem = 0
      end
      if ms >= now then debt = (ms - now) * limit + rem end
    end
    st[i] = { debt }
    if debt > burst * w then all = false end
  else
    local total, lastq, lastn, stale = prune(KEYS[2 * i - 1], KEYS[2 * i], w)
    st[i] = { total, lastq, lastn, stale }
    if total >= limit then all = false end
  end
end

local out = {}
for i = 1, nrules do
  local a = 1 + (i - 1) * 4
  local kind, limit, burst, w = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local o = (i - 1) * 5
  if kind == 'b' then
    local debt = st[i][1]
    local tau = burst * w
    local d = debt
    if all then
      d = debt + w
      local whole = math.floor(d / limit)
      redis.call('SET', KEYS[2 * i - 1], fmt(now + whole) .. ':' .. fmt(d - whole * limit) .. ':' .. fmt(limit), 'PX', math.ceil(d / limit))
    end
    out[o + 1] = (debt <= tau) and 1 or 0
    out[o + 2] = burst + 1
    out[o + 3] = math.max(0, math.floor((tau - d) / w) + 1)
    out[o + 4] = math.ceil(d / limit)
    out[o + 5] = (debt <= tau) and 0 or math.ceil((debt - tau) / limit)
  else
    local total, lastq, lastn, stale = st[i][1], st[i][2], st[i][3], st[i][4]
    out[o + 2] = limit
    out[o + 5] = 0
    if kind == 'w' and all then
      local g = 1
      if limit > MAX then g = math.ceil(w / MAX) end
      local q = record(KEYS[2 * i - 1], KEYS[2 * i], total, lastq, lastn, bucket(g, lastq), 1, w)
      out[o + 1] = 1
      out[o + 3] = math.max(0, limit - total - 1)
      out[o + 4] = q + w - now
    else
      settle(KEYS[2 * i], total, lastq, stale, w)
      out[o + 1] = (total < limit) and 1 or 0
      out[o + 3] = math.max(0, limit - total)
      out[o + 4] = lastq and (lastq + w - now) or 0
      if total >= limit then
        local es = redis.call('LRANGE', KEYS[2 * i - 1], 0, -1)
        local left = total
        for j = 1, #es do
          local q, n = pair(es[j])
          left = left - n
          if left < limit then
            out[o + 5] = q + w - now
            break
          end
        end
      end
    end
  end
end
return out
`;

/** KEYS: list, total. ARGV: now, amount, windowMs. */
export const ADD_LUA = `${COMMON}
local amount, w = tonumber(ARGV[2]), tonumber(ARGV[3])
local total, lastq, lastn = prune(KEYS[1], KEYS[2], w)
record(KEYS[1], KEYS[2], total, lastq, lastn, bucket(math.ceil(w / MAX), lastq), amount, w)
return 1
`;

/**
 * KEYS: list, total (a 'window' rule's). ARGV: now, q, windowMs. Takes one unit
 * out of the entry of bucket q (the entry goes when it held one); the total and
 * both keys' expiry follow the list's newest entry. Returns 1 when it took one.
 */
export const RELEASE_LUA = `${COMMON}
local q, w = tonumber(ARGV[2]), tonumber(ARGV[3])
local total, lastq, lastn, stale = prune(KEYS[1], KEYS[2], w)
if not lastq then return 0 end
local es = redis.call('LRANGE', KEYS[1], 0, -1)
for j = #es, 1, -1 do
  local eq, n = pair(es[j])
  if eq < q then break end
  if eq == q then
    if n > 1 then
      redis.call('LSET', KEYS[1], j - 1, fmt(q) .. ':' .. fmt(n - 1))
    else
      redis.call('LREM', KEYS[1], 1, es[j])
    end
    local e = redis.call('LINDEX', KEYS[1], -1)
    if not e then
      redis.call('DEL', KEYS[2])
      return 1
    end
    local nq = pair(e)
    local ttl = nq + w - now
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('SET', KEYS[2], fmt(total - 1), 'PX', ttl)
    return 1
  end
end
settle(KEYS[2], total, lastq, stale, w)
return 0
`;
