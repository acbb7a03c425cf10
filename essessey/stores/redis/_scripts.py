"""The Lua scripts of :class:`~essessey.stores.redis.RedisEventStore`: every change to a
stream id's keys is one script, so a reader never sees half of one and two replicas never
interleave inside one.

Keys of a stream id ``sid`` under ``prefix`` (see docs/redis.md): ``<prefix>:<sid>:m``, a
hash (``epoch``, ``seq`` the last event's sequence, ``first`` the oldest retained one,
``bytes`` as the budgets count them, ``closed``, ``run`` the time in ms until which the
stream counts as running, ``holder`` the hub that claimed its turn (see the leases below),
``tok``/``tokseq`` the last append's retry token and sequence);
``<prefix>:<sid>:e``, a Redis stream whose entry ``0-<seq>`` holds the fields ``e`` (the
event name) and ``d`` (its data); ``<prefix>:<sid>:x``, set while a running stream that
was cleared must not be re-created mid-message; ``<prefix>:streams``, a sorted set of the
stream ids by last update (``<prefix>:streams:clock`` counts the updates). Notifications
go to the channel ``<prefix>:<sid>:n`` as ``<epoch> <seq> <kind>[ <name>]`` and, for an
event, a newline and its data; the kinds are
``e`` (an event), ``o`` (opened), ``c`` (closed), ``r`` (cleared) and ``d`` (dropped to keep
a bound); requests to cancel the running turn go to ``<prefix>:<sid>:k`` (kind ``k``), so
the turn's own replica does not receive its events to hear them.

Leases. A hub claims a stream id for its turn (``holder`` and ``run``), renews the claim
while the turn runs and releases it by closing the stream. While ``run`` lies ahead,
another holder's claim is refused, and an append or a close that names a holder is refused
unless it is the current one, so a replica that lost its lease can never write into the
turn that replaced it. A claim whose ``run`` has passed with the stream still open lapsed:
its holder renews it again as long as nobody else took it (it could not reach Redis for a
while), and the next claim, or a reader that notices, takes it for abandoned (its replica
died) only once its own store has seen Redis answer for a whole ``running_ttl``; then it
ends the message with an error event and closes the stream, in one script, so it happens
once.

Times come from the server's ``TIME``, so the replicas' clocks never need to agree.
"""

from __future__ import annotations

from typing import Final

_COMMON: Final = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Whether a turn holds a live lease on a stream, from its meta's fields: a holder
-- named, the stream open, its running-until not passed.
local function leased(run, holder, closed)
  return run and closed ~= '1' and holder ~= '' and tonumber(run) >= now_ms()
end

-- The index orders stream ids by a counter, not the time: two updates in one
-- millisecond keep their order.
local function keep(meta, events, index, sid, ttl)
  redis.call('PEXPIRE', meta, ttl)
  redis.call('PEXPIRE', events, ttl)
  redis.call('ZADD', index, redis.call('INCR', index .. ':clock'), sid)
end

-- Make room for one more stream id: drop finished streams, updated longest ago first,
-- while max_streams or more are held. False when every one of them is running.
local function make_room(index, key_prefix, max_streams, now)
  local count = redis.call('ZCARD', index)
  if count < max_streams then return true end
  local members = redis.call('ZRANGE', index, 0, -1)
  for _, other in ipairs(members) do
    if count < max_streams then break end
    local meta = key_prefix .. other .. ':m'
    local run = redis.call('HGET', meta, 'run')
    if not run then
      redis.call('ZREM', index, other)  -- expired already
      count = count - 1
    elseif tonumber(run) < now then
      local epoch = redis.call('HGET', meta, 'epoch')
      local seq = redis.call('HGET', meta, 'seq')
      redis.call('DEL', meta, key_prefix .. other .. ':e')
      redis.call('ZREM', index, other)
      redis.call('PUBLISH', key_prefix .. other .. ':n', epoch .. ' ' .. seq .. ' d')
      count = count - 1
    end
  end
  return count < max_streams
end

-- The stream id's meta hash, created (with a fresh epoch) when missing.
-- Returns the epoch, or nil and an error reply.
local function create_or_touch(meta, events, index, key_prefix, epoch_if_new, max_streams,
                               now)
  local epoch = redis.call('HGET', meta, 'epoch')
  if epoch then return epoch end
  if not make_room(index, key_prefix, max_streams, now) then
    return nil, redis.error_reply('ESSFULL the store holds ' .. max_streams ..
      ' streams whose turns are running')
  end
  redis.call('DEL', events)
  redis.call('HSET', meta, 'epoch', epoch_if_new, 'seq', 0, 'first', 1, 'bytes', 0,
             'closed', 0, 'run', 0, 'holder', '')
  return epoch_if_new
end

-- Append an event to an existing stream id, trimmed to its bounds; its sequence.
local function add_event(meta, events, key_prefix, sid, epoch, name, data, max_events,
                         max_bytes, overhead)
  local seq = redis.call('HINCRBY', meta, 'seq', 1)
  redis.call('XADD', events, '0-' .. seq, 'e', name, 'd', data)
  local bytes = redis.call('HINCRBY', meta, 'bytes', #data + overhead)
  local first = tonumber(redis.call('HGET', meta, 'first'))
  -- The oldest events go first, past either bound; the newest always stays.
  while first < seq and (seq - first + 1 > max_events or bytes > max_bytes) do
    local oldest = redis.call('XRANGE', events, '0-' .. first, '0-' .. first)
    if oldest[1] then
      bytes = bytes - (#oldest[1][2][4] + overhead)
      redis.call('XDEL', events, '0-' .. first)
    end
    first = first + 1
  end
  redis.call('HSET', meta, 'first', first, 'bytes', bytes, 'closed', 0)
  redis.call('PUBLISH', key_prefix .. sid .. ':n', epoch .. ' ' .. seq .. ' e ' .. name ..
             '\\n' .. data)
  return seq
end

local function close(meta, key_prefix, sid, epoch)
  redis.call('HSET', meta, 'closed', 1, 'run', 0, 'holder', '')
  redis.call('PUBLISH', key_prefix .. sid .. ':n',
             epoch .. ' ' .. redis.call('HGET', meta, 'seq') .. ' c')
end

-- A turn whose holder's lease ran out with the stream open: end its message with an
-- error event (unless it ended already) and close the stream. True when it did.
local function abandon(meta, events, key_prefix, sid, now, error_data, max_events,
                       max_bytes, overhead)
  local state = redis.call('HMGET', meta, 'epoch', 'closed', 'run', 'holder')
  if not state[1] or state[2] == '1' or state[4] == '' or tonumber(state[3]) >= now then
    return false
  end
  local last = redis.call('XREVRANGE', events, '+', '-', 'COUNT', 1)
  local name = last[1] and last[1][2][2]
  if name and name ~= 'message_stop' and name ~= 'error' then
    add_event(meta, events, key_prefix, sid, state[1], 'error', error_data, max_events,
              max_bytes, overhead)
  end
  close(meta, key_prefix, sid, state[1])
  return true
end
"""

APPEND: Final = (
    _COMMON
    + """
-- KEYS: meta, events, index, tombstone
-- ARGV: sid, key_prefix, name, data, epoch_if_new, max_events, max_bytes, ttl_ms,
--       max_streams, overhead, token, run_ms, holder ('' for any writer)
local meta, events, index, tomb = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local sid, key_prefix, name, data = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local max_events, max_bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
local ttl, max_streams, overhead = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local token, run_ms, holder = ARGV[11], tonumber(ARGV[12]), ARGV[13]
local now = now_ms()

-- A retry of an append that was stored (its reply lost): the same id, stored once.
if redis.call('HGET', meta, 'tok') == token then
  return {redis.call('HGET', meta, 'epoch'), tonumber(redis.call('HGET', meta, 'tokseq'))}
end
if holder ~= '' and redis.call('HGET', meta, 'holder') ~= holder then
  return redis.error_reply('ESSLOST this turn no longer holds the stream')
end
if redis.call('EXISTS', meta) == 0 and redis.call('EXISTS', tomb) == 1 then
  if name ~= 'message_start' then
    return redis.error_reply('ESSRESET the stream was cleared while its turn ran; ' ..
      'only a new message may start it again')
  end
  redis.call('DEL', tomb)
end
local epoch, err = create_or_touch(meta, events, index, key_prefix, ARGV[5], max_streams,
                                   now)
if not epoch then return err end
local seq = add_event(meta, events, key_prefix, sid, epoch, name, data, max_events,
                      max_bytes, overhead)
redis.call('HSET', meta, 'tok', token, 'tokseq', seq)
if tonumber(redis.call('HGET', meta, 'run')) >= now then
  redis.call('HSET', meta, 'run', now + run_ms)
end
keep(meta, events, index, sid, ttl)
return {epoch, seq}
"""
)

OPEN: Final = (
    _COMMON
    + """
-- KEYS: meta, events, index, tombstone
-- ARGV: sid, key_prefix, epoch_if_new, ttl_ms, max_streams, run_ms, holder ('': a plain
--       open, no claim), error_data, max_events, max_bytes, overhead, may_end ('1' when
--       the claimer may take a lapsed lease for a dead holder's, see the store)
local meta, events, index, tomb = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local sid, key_prefix = ARGV[1], ARGV[2]
local ttl, max_streams, run_ms = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local holder = ARGV[7]
local now = now_ms()
if holder ~= '' then
  local state = redis.call('HMGET', meta, 'run', 'holder', 'closed')
  local other = state[1] and state[2] ~= '' and state[2] ~= holder and state[3] ~= '1'
  if other and tonumber(state[1]) >= now then
    return redis.error_reply('ESSBUSY a turn is running on the stream elsewhere')
  end
  if other and ARGV[12] ~= '1' then
    -- Lapsed, but this claimer cannot tell a dead holder from one that could not reach
    -- Redis for a while: the holder may still take it back.
    return redis.error_reply('ESSBUSY the lease of the turn running on the stream ' ..
      'lapsed while Redis was out of reach; its replica may take it back')
  end
  abandon(meta, events, key_prefix, sid, now, ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10]),
          tonumber(ARGV[11]))
end
redis.call('DEL', tomb)  -- a new turn may start afresh
local epoch, err = create_or_touch(meta, events, index, key_prefix, ARGV[3], max_streams,
                                   now)
if not epoch then return err end
redis.call('HSET', meta, 'closed', 0, 'run', now + run_ms, 'holder', holder)
keep(meta, events, index, sid, ttl)
redis.call('PUBLISH', key_prefix .. sid .. ':n',
           epoch .. ' ' .. redis.call('HGET', meta, 'seq') .. ' o')
return epoch
"""
)

CLOSE: Final = (
    _COMMON
    + """
-- KEYS: meta, events, index
-- ARGV: sid, key_prefix, ttl_ms, holder ('': whoever holds it)
local meta, events, index = KEYS[1], KEYS[2], KEYS[3]
local sid, key_prefix, ttl, holder = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return 0 end
if holder ~= '' and redis.call('HGET', meta, 'holder') ~= holder then return 0 end
close(meta, key_prefix, sid, epoch)
keep(meta, events, index, sid, ttl)
return 1
"""
)

CLEAR: Final = (
    _COMMON
    + """
-- KEYS: meta, events, index, tombstone
-- ARGV: sid, key_prefix, ttl_ms
local meta, events, index, tomb = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local sid, key_prefix, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local epoch = redis.call('HGET', meta, 'epoch')
if not epoch then return 0 end
if tonumber(redis.call('HGET', meta, 'run')) >= now_ms() then
  redis.call('SET', tomb, 1, 'PX', ttl)
end
local seq = redis.call('HGET', meta, 'seq')
redis.call('DEL', meta, events)
redis.call('ZREM', index, sid)
redis.call('PUBLISH', key_prefix .. sid .. ':n', epoch .. ' ' .. seq .. ' r')
return 1
"""
)

KEEP_RUNNING: Final = (
    _COMMON
    + """
-- KEYS: meta, events, index
-- ARGV: sid, ttl_ms, run_ms, holder ('': whoever holds it)
local meta, events, index = KEYS[1], KEYS[2], KEYS[3]
local sid, ttl, run_ms, holder = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local state = redis.call('HMGET', meta, 'run', 'holder', 'closed')
if not state[1] or state[3] == '1' then return 0 end
if holder ~= '' and state[2] ~= holder then return 0 end
local now = now_ms()
if holder == '' and tonumber(state[1]) < now then return 0 end
redis.call('HSET', meta, 'run', now + run_ms)
keep(meta, events, index, sid, ttl)
return 1
"""
)

ABANDON: Final = (
    _COMMON
    + """
-- KEYS: meta, events
-- ARGV: sid, key_prefix, error_data, max_events, max_bytes, overhead
local ended = abandon(KEYS[1], KEYS[2], ARGV[2], ARGV[1], now_ms(), ARGV[3],
                      tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]))
if ended then return 1 end
return 0
"""
)

TURN_RUNNING: Final = (
    _COMMON
    + """
-- KEYS: meta
-- 1 while a turn holds a live lease on the stream, else 0; writes nothing.
local state = redis.call('HMGET', KEYS[1], 'run', 'holder', 'closed')
if leased(state[1], state[2], state[3]) then return 1 end
return 0
"""
)

CANCEL: Final = (
    _COMMON
    + """
-- KEYS: meta
-- ARGV: sid, key_prefix
-- Ask the holder of a running turn to cancel it: 1 when one holds it, else 0.
local state = redis.call('HMGET', KEYS[1], 'epoch', 'run', 'holder', 'seq', 'closed')
if not state[1] or not leased(state[2], state[3], state[5]) then return 0 end
redis.call('PUBLISH', ARGV[2] .. ARGV[1] .. ':k', state[1] .. ' ' .. state[4] .. ' k')
return 1
"""
)
