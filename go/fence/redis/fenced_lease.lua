#!lua name=fenced_lease
-- fenced-lease: fencing tokens checked by Redis itself, for any client (Redis 7+, Valkey).
--
-- Load (idempotent; again to upgrade):
--   redis-cli -x FUNCTION LOAD REPLACE < fence/redis/fenced_lease.lua
--
-- Call (every write of a holder carries its token):
--   FCALL fenced_call 2 <key> <fence key> <token> <command> [<arg> ...]
--       runs `<command> <key> <arg> ...` and returns its reply, e.g.
--       FCALL fenced_call 2 payouts:{42} payouts:{42}:fence 7 RPUSH worker-a
--   FCALL fenced_set 2 <key> <fence key> <token> <value> [<SET option> ...]
--       the same for SET, e.g. FCALL fenced_set 2 payout:42 {payout:42}:fence 7 "paid by a"
--
-- The fence key holds the highest token accepted for the key, in the key's cluster slot:
-- `<key>:fence` when the key has a hash tag (`{...}`), else `{<key>}:fence`. It is passed
-- as a key (so clusters route it) and checked, so every client fences with the same one.
--
-- A token lower than the highest accepted is refused, nothing written, with the error reply
--   FENCED <presented> <highest>
-- An equal or higher token runs the command, then records the token (a command that fails
-- records nothing). Tokens are decimal integers 0..9223372036854775807, compared exactly as
-- strings: Lua's numbers are doubles, which cannot tell 2^53 from 2^53 + 1.

local MAX_TOKEN = '9223372036854775807'

-- Is `a` lower than `b`? Both are canonical decimals (digits, no leading zero).
local function lower(a, b)
  return #a < #b or (#a == #b and a < b)
end

local function is_token(s)
  return type(s) == 'string'
    and s:match('^%d+$') ~= nil
    and (s == '0' or s:sub(1, 1) ~= '0')
    and not lower(MAX_TOKEN, s)
end

-- The part of `key` Redis Cluster hashes: the first non-empty `{...}`, else the whole key.
local function hash_tag(key)
  local open = key:find('{', 1, true)
  if open then
    local close = key:find('}', open + 1, true)
    if close and close > open + 1 then
      return key:sub(open + 1, close - 1)
    end
  end
  return key
end

local function fence_key(key)
  if hash_tag(key) ~= key then
    return key .. ':fence'
  end
  if key:find('[{}]') then
    return nil
  end
  return '{' .. key .. '}:fence'
end

-- Runs `command key args...` if `token` is not lower than the highest accepted for `key`.
local function fenced(keys, token, command, args)
  if #keys ~= 2 then
    return redis.error_reply('ERR fenced_lease takes 2 keys, the key and its fence key; got ' .. #keys)
  end
  local key, fence = keys[1], keys[2]
  local expected = fence_key(key)
  if not expected then
    return redis.error_reply('ERR key ' .. key .. ' has braces but no hash tag; give it one, e.g. {name}:rest')
  end
  if fence ~= expected then
    return redis.error_reply('ERR the fence key of ' .. key .. ' is ' .. expected .. ', not ' .. fence)
  end
  if not is_token(token) then
    return redis.error_reply('ERR invalid fencing token ' .. tostring(token)
      .. ': tokens are decimal integers from 0 to ' .. MAX_TOKEN)
  end
  if not command then
    return redis.error_reply('ERR no command to run')
  end
  local highest = redis.call('GET', fence)
  if highest then
    if not is_token(highest) then
      return redis.error_reply('ERR ' .. fence .. ' holds ' .. highest .. ', not a token')
    end
    if lower(token, highest) then
      return redis.error_reply('FENCED ' .. token .. ' ' .. highest)
    end
  end
  local reply = redis.call(command, key, unpack(args))
  redis.call('SET', fence, token)
  return reply
end

redis.register_function('fenced_call', function(keys, args)
  return fenced(keys, args[1], args[2], { unpack(args, 3) })
end)

redis.register_function('fenced_set', function(keys, args)
  return fenced(keys, args[1], 'SET', { unpack(args, 2) })
end)
