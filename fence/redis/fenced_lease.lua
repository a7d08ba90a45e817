#!lua name=fenced_lease
-- fenced-lease: fencing tokens checked by Redis itself, for any client (Redis 7+, Valkey).
--
-- Load (idempotent; again to upgrade):
--   redis-cli -x FUNCTION LOAD REPLACE < fence/redis/fenced_lease.lua
--
-- THE RULE. A scope's keys share one fence key, which holds the highest token any write of the
-- scope presented (its mark). Every write through these functions presents a token; one lower
-- than the mark is refused, nothing written; an equal or higher one runs, and raises the mark.
--   FCALL fenced_call 2 <key> <fence key> <token> <command> [<arg> ...]
--       runs `<command> <key> <arg> ...`, returns its reply:
--       FCALL fenced_call 2 payouts:{42} {42}:fence 8 RPUSH worker-b
--   FCALL fenced_set 2 <key> <fence key> <token> <value> [<SET option> ...]
--       the same for SET: FCALL fenced_set 2 receipt:{42} {42}:fence 8 "paid"
--   FCALL fenced_batch <n> <fence key> <key> ... <token> (<count> <command> <key> [<arg> ...]) ...
--       one check, then each command in order (`count`: the words after it, command first);
--       every command's key is one of the n - 1 keys declared; returns their replies:
--       FCALL fenced_batch 3 {42}:fence payouts:{42} receipt:{42} 8 3 RPUSH payouts:{42} b 3 SET receipt:{42} paid
-- A fence key is `{<scope>}:fence`, or any key ending in `:fence` whose hash tag is the data
-- keys' (`<key>:fence` for a key with a hash tag, `{<key>}:fence` for one without: one mark per
-- key, the compatible form). Same hash tag, same cluster slot: a scope's keys live on one node.
--
-- Refused: the error reply `FENCED <presented> <highest>`, and the refusal is counted beside
-- the mark, in the hash `<fence key>:refused` (same hash tag, same slot): `count`, and the last
-- one's `token`, `highest` and `at` (Unix ms, the server's clock). Read it with
--   FCALL_RO fenced_refusals 1 <fence key>
-- which returns [count, last token, highest then, at ms] (count 0 and nothing else when none),
-- or HGETALL <fence key>:refused. A refusal writes only this hash, and only where the caller's
-- ACL allows HINCRBY, HSET and TIME (fence/README.md's does). Bad input, nothing written:
-- `BADTOKEN` (not a decimal integer 0..2^63-1), `BADFENCEKEY` (not a fence key of the data
-- keys' hash tag), `BADKEY` (braces but no hash tag), `BADCALL` (arguments malformed).
-- Tokens are compared exactly as strings, not as Lua's doubles. A higher token is recorded
-- once a command has run: a call whose command fails records nothing; a command that fails
-- stops a batch, and the commands before it stay (as in MULTI/EXEC), with the token recorded.
--
-- COST: one GET of the fence key, and a SET when the token is higher, per call; a refusal, one
-- HINCRBY and one HSET more.
--
-- WHO CAN STILL BYPASS IT: any client that may write the keys directly (SET, DEL, ...) or the
-- fence key (lowering the mark). Redis cannot keep a client to functions: since Redis 7 the
-- commands a function runs are checked against the caller's ACL, so a user allowed to write
-- through fenced_call may write directly too. Give holders only FCALL, the reads and the
-- commands their writes run, on their scopes' keys (fence/README.md shows the ACL), never
-- FUNCTION, SCRIPT, EVAL, FLUSHALL or FLUSHDB.

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

-- An error reply when `fence` is not a fence key of data key `key`, else nil.
local function wrong_fence(key, fence)
  local tag = hash_tag(key)
  if tag == key and key:find('[{}]') then
    return redis.error_reply('BADKEY key ' .. key .. ' has braces but no hash tag; give it one, e.g. {name}:rest')
  end
  if fence:sub(-6) ~= ':fence' or hash_tag(fence) ~= tag then
    return redis.error_reply('BADFENCEKEY ' .. fence .. ' is not a fence key of ' .. key
      .. ': a fence key ends in :fence and has the hash tag {' .. tag .. '}, e.g. {' .. tag .. '}:fence')
  end
  return nil
end

-- Checks `token` against the mark in `fence`: an error reply if refused, else nil and
-- whether the token is higher than the mark (to be recorded once a command has run).
local function check(fence, token)
  if not is_token(token) then
    return redis.error_reply('BADTOKEN invalid fencing token ' .. tostring(token)
      .. ': tokens are decimal integers from 0 to ' .. MAX_TOKEN), false
  end
  local highest = redis.call('GET', fence)
  if highest then
    if not is_token(highest) then
      return redis.error_reply('BADFENCEKEY ' .. fence .. ' holds ' .. highest .. ', not a token'), false
    end
    if lower(token, highest) then
      -- Counted where the caller's ACL lets it write the hash (HINCRBY, HSET on the key);
      -- where it does not, the refusal is still the reply, only not counted.
      local refused = fence .. ':refused'
      if type(redis.pcall('HINCRBY', refused, 'count', 1)) == 'number' then
        local now = redis.pcall('TIME')
        local at = now.err and '' or string.format('%.0f', now[1] * 1000 + math.floor(now[2] / 1000))
        redis.pcall('HSET', refused, 'token', token, 'highest', highest, 'at', at)
      end
      return redis.error_reply('FENCED ' .. token .. ' ' .. highest), false
    end
    return nil, highest ~= token
  end
  return nil, true
end

-- Runs `command key args...` after the check.
local function fenced(keys, token, command, args)
  if #keys ~= 2 then
    return redis.error_reply('BADCALL fenced_call and fenced_set take 2 keys, the key and its fence key; got ' .. #keys)
  end
  local key, fence = keys[1], keys[2]
  local wrong = wrong_fence(key, fence)
  if wrong then
    return wrong
  end
  if not command then
    return redis.error_reply('BADCALL no command to run')
  end
  local refused, higher = check(fence, token)
  if refused then
    return refused
  end
  local reply = redis.call(command, key, unpack(args))
  if higher then
    redis.call('SET', fence, token)
  end
  return reply
end

redis.register_function('fenced_call', function(keys, args)
  return fenced(keys, args[1], args[2], { unpack(args, 3) })
end)

redis.register_function('fenced_set', function(keys, args)
  return fenced(keys, args[1], 'SET', { unpack(args, 2) })
end)

-- KEYS: the fence key, then every data key; ARGV: the token, then the commands.
redis.register_function('fenced_batch', function(keys, args)
  local fence = keys[1]
  if #keys < 2 then
    return redis.error_reply('BADCALL fenced_batch takes the fence key and at least one data key')
  end
  local declared = {}
  for i = 2, #keys do
    local wrong = wrong_fence(keys[i], fence)
    if wrong then
      return wrong
    end
    declared[keys[i]] = true
  end
  -- Parse every command before anything runs, so that a malformed batch writes nothing.
  local commands, i = {}, 2
  while i <= #args do
    local count = tonumber(args[i])
    if not count or count < 2 or count ~= math.floor(count) or i + count > #args then
      return redis.error_reply('BADCALL command ' .. (#commands + 1) .. ': expected <count> <command> <key> [<arg> ...], with count >= 2 words after it')
    end
    local key = args[i + 2]
    if not declared[key] then
      return redis.error_reply('BADCALL command ' .. (#commands + 1) .. ' writes ' .. key .. ', which is not among the keys declared')
    end
    commands[#commands + 1] = { unpack(args, i + 1, i + count) }
    i = i + count + 1
  end
  if #commands == 0 then
    return redis.error_reply('BADCALL no command to run')
  end
  local token = args[1]
  local refused, higher = check(fence, token)
  if refused then
    return refused
  end
  local replies = {}
  for n, command in ipairs(commands) do
    replies[n] = redis.call(unpack(command))
    if higher then -- recorded with the first command that ran
      redis.call('SET', fence, token)
      higher = false
    end
  end
  return replies
end)

-- KEYS: a fence key. Its refusals: {count, last token, highest then, at (Unix ms)}, or {0}.
redis.register_function{
  function_name = 'fenced_refusals',
  callback = function(keys)
    if #keys ~= 1 or keys[1]:sub(-6) ~= ':fence' then
      return redis.error_reply('BADCALL fenced_refusals takes 1 key, a fence key (ending in :fence)')
    end
    local r = redis.call('HMGET', keys[1] .. ':refused', 'count', 'token', 'highest', 'at')
    if not r[1] then
      return { 0 }
    end
    return { tonumber(r[1]), r[2], r[3], r[4] }
  end,
  flags = { 'no-writes' },
}
