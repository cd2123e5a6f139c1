-- metadata.lua owns reading and merging metadata JSON without a cjson
-- round trip (which would change its digits), for commits that merge
-- metadata and for metadata matches.

-- json_members splits JSON object text into its members {key text, value
-- text}, both raw (values keep their exact digits, which a cjson round trip
-- would not); nil when s is not an object.
local function json_members(s)
  local out, i, n = {}, 1, #s
  local function ch() return string.sub(s, i, i) end
  local function ws() i = string.find(s, '[^ \t\r\n]', i) or (n + 1) end
  -- str_end is the index of the quote closing the string opening at j.
  local function str_end(j)
    j = j + 1
    while j <= n do
      local c = string.sub(s, j, j)
      if c == '\\' then j = j + 2 elseif c == '"' then return j else j = j + 1 end
    end
    return nil
  end
  ws()
  if ch() ~= '{' then return nil end
  i = i + 1
  ws()
  if ch() == '}' then return out end
  while true do
    ws()
    if ch() ~= '"' then return nil end
    local ke = str_end(i)
    if not ke then return nil end
    local key = string.sub(s, i, ke)
    i = ke + 1
    ws()
    if ch() ~= ':' then return nil end
    i = i + 1
    ws()
    local vs, depth = i, 0
    while i <= n do
      local c = ch()
      if c == '"' then
        local e = str_end(i)
        if not e then return nil end
        i = e + 1
      elseif c == '{' or c == '[' then
        depth = depth + 1
        i = i + 1
      elseif c == '}' or c == ']' then
        if depth == 0 then break end
        depth = depth - 1
        i = i + 1
      elseif c == ',' and depth == 0 then
        break
      else
        i = i + 1
      end
    end
    local val = string.match(string.sub(s, vs, i - 1), '^(.-)%s*$')
    if val == '' then return nil end
    out[#out + 1] = {key, val}
    if ch() == ',' then
      i = i + 1
    elseif ch() == '}' then
      return out
    else
      return nil
    end
  end
end

-- meta_merge is the stored metadata object with the keys of incoming
-- added or replaced (both JSON text, '' when empty); nil when either is
-- not a JSON object. Keys compare decoded, so differently escaped
-- spellings of one key are one key.
local function meta_merge(stored, incoming)
  if incoming == '' then return stored end
  if stored == '' then return incoming end
  local a, b = json_members(stored), json_members(incoming)
  if not a or not b then return nil end
  local pos = {}
  for i, m in ipairs(a) do pos[cjson.decode(m[1])] = i end
  for _, m in ipairs(b) do
    local k = cjson.decode(m[1])
    if pos[k] then
      a[pos[k]] = m
    else
      a[#a + 1] = m
      pos[k] = #a
    end
  end
  local parts = {}
  for i, m in ipairs(a) do parts[i] = m[1] .. ':' .. m[2] end
  return '{' .. table.concat(parts, ',') .. '}'
end

-- deep_eq compares two decoded JSON values (objects key by key).
local function deep_eq(x, y)
  if type(x) ~= type(y) then return false end
  if type(x) ~= 'table' then return x == y end
  for k, v in pairs(x) do
    if not deep_eq(v, y[k]) then return false end
  end
  for k in pairs(y) do
    if x[k] == nil then return false end
  end
  return true
end

-- meta_matches: meta holds every key of match with an equal JSON value.
local function meta_matches(meta, match)
  if type(meta) ~= 'table' then return false end
  for k, v in pairs(match) do
    if not deep_eq(meta[k], v) then return false end
  end
  return true
end
