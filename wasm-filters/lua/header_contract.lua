-- The header contract in Envoy's Lua filter (LuaJIT), for the benchmark's
-- side-by-side comparison with the Wasm module: the same steps on the same
-- configuration (CONFIG below is generated from mesh.header_contract's filter
-- JSON): strip, claims from jwt_authn metadata, tenant whitelist, QoS class,
-- HMAC-SHA256 session signature, error class. SHA-256 is written here with
-- LuaJIT's `bit` library, as the Lua filter offers no HMAC.
local bit = require("bit")
local band, bor, bxor, bnot, rshift, lshift, ror, tobit =
  bit.band, bit.bor, bit.bxor, bit.bnot, bit.rshift, bit.lshift, bit.ror, bit.tobit
local byte, char, format, sub, concat = string.byte, string.char, string.format, string.sub, table.concat

local CONFIG = __CONFIG__

local K = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

local function sha256(msg)
  local len = #msg
  msg = msg .. "\128" .. string.rep("\0", (55 - len) % 64)
  local bits = len * 8
  msg = msg .. char(0, 0, 0, 0, band(rshift(bits, 24), 255), band(rshift(bits, 16), 255),
                    band(rshift(bits, 8), 255), band(bits, 255))
  local h0, h1, h2, h3 = 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a
  local h4, h5, h6, h7 = 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
  local w = {}
  for chunk = 1, #msg, 64 do
    for i = 0, 15 do
      local a, b, c, d = byte(msg, chunk + 4 * i, chunk + 4 * i + 3)
      w[i] = bor(lshift(a, 24), lshift(b, 16), lshift(c, 8), d)
    end
    for i = 16, 63 do
      local s0 = bxor(ror(w[i - 15], 7), ror(w[i - 15], 18), rshift(w[i - 15], 3))
      local s1 = bxor(ror(w[i - 2], 17), ror(w[i - 2], 19), rshift(w[i - 2], 10))
      w[i] = tobit(w[i - 16] + s0 + w[i - 7] + s1)
    end
    local a, b, c, d, e, f, g, h = h0, h1, h2, h3, h4, h5, h6, h7
    for i = 0, 63 do
      local t1 = tobit(h + bxor(ror(e, 6), ror(e, 11), ror(e, 25)) + bxor(band(e, f), band(bnot(e), g)) + K[i + 1] + w[i])
      local t2 = tobit(bxor(ror(a, 2), ror(a, 13), ror(a, 22)) + bxor(band(a, b), band(a, c), band(b, c)))
      h, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + t2)
    end
    h0, h1, h2, h3 = tobit(h0 + a), tobit(h1 + b), tobit(h2 + c), tobit(h3 + d)
    h4, h5, h6, h7 = tobit(h4 + e), tobit(h5 + f), tobit(h6 + g), tobit(h7 + h)
  end
  local out = {}
  for i, v in ipairs({h0, h1, h2, h3, h4, h5, h6, h7}) do
    out[i] = char(band(rshift(v, 24), 255), band(rshift(v, 16), 255), band(rshift(v, 8), 255), band(v, 255))
  end
  return concat(out)
end

local function xor_pad(key, pad)
  local out = {}
  for i = 1, 64 do out[i] = char(bxor(byte(key, i) or 0, pad)) end
  return concat(out)
end

local KEY = CONFIG.key
local IPAD, OPAD = xor_pad(KEY, 0x36), xor_pad(KEY, 0x5c)

local function hmac_hex(msg)
  local d = sha256(OPAD .. sha256(IPAD .. msg))
  return (d:gsub(".", function(c) return format("%02x", byte(c)) end))
end

local function matches(patterns, name)
  for _, p in ipairs(patterns) do
    if sub(p, -1) == "*" then
      if sub(name, 1, #p - 1) == sub(p, 1, -2) then return true end
    elseif p == name then return true end
  end
  return false
end

local STRIP = {}
for _, h in ipairs(CONFIG.strip) do STRIP[h] = true end

local function is_token(name)
  return name:find("^[%w!#$%%&'*+%-.^_`|~]+$") ~= nil
end

-- mesh.session.carriable: no CTL/non-ASCII, no SP/HTAB at either end (HTTP/1 strips them)
local function safe_value(v)
  return type(v) == "string" and #v > 0 and #v <= 1024 and v:find("[%z\1-\8\10-\31\127-\255]") == nil
    and v:find("^[ \t]") == nil and v:find("[ \t]$") == nil
end

function envoy_on_request(handle)
  local headers = handle:headers()
  local payload = nil
  local md = handle:streamInfo():dynamicMetadata():get(CONFIG.payload_ns)
  if md then payload = md[CONFIG.payload_key] end

  local claim_values, tenant = {}, nil
  for _, m in ipairs(CONFIG.claims) do
    local v = payload and payload[m.claim]
    if safe_value(v) then
      claim_values[m.header] = v
      if m.header == CONFIG.tenant_header then tenant = v end
    end
  end
  local policy = tenant and CONFIG.tenants[tenant]

  local drop, requested, alpn, n_rid = {}, nil, nil, 0
  for name, value in pairs(headers) do
    if name == "x-request-id" then n_rid = n_rid + 1 end
    if sub(name, 1, 1) ~= ":" then
      if not is_token(name) then
        handle:respond({[":status"] = "400"}, "header name is not an RFC 7230 token\n")
        return
      end
      if STRIP[name] then drop[#drop + 1] = name
      elseif matches(CONFIG.prefixes, name) then
        if not (policy and matches(policy.allowed, name)) then drop[#drop + 1] = name end
      elseif policy and policy.strict and not matches(policy.allowed, name)
             and not matches(CONFIG.common, name) and name ~= CONFIG.priority_header then
        drop[#drop + 1] = name
      end
      if requested == nil and name == CONFIG.priority_header then
        requested = CONFIG.priority[value:lower()]
      end
      if alpn == nil and CONFIG.alpn_header ~= "" and name == CONFIG.alpn_header then alpn = value end
    end
  end
  if n_rid > 1 then
    handle:respond({[":status"] = "400"}, "x-request-id appears more than once\n")
    return
  end
  for _, name in ipairs(drop) do headers:remove(name) end

  if requested == nil and alpn ~= nil then requested = CONFIG.alpn[alpn]
  elseif requested == nil then requested = CONFIG.protocol[handle:streamInfo():protocol() or ""] end
  if requested == nil then requested = CONFIG.default end
  local ceiling = CONFIG.ceiling
  local tier = payload and payload[CONFIG.tier_claim]
  if tier and CONFIG.tiers[tier] then ceiling = CONFIG.tiers[tier] end
  local class = CONFIG.levels[requested] >= CONFIG.levels[ceiling] and requested or ceiling

  for h, v in pairs(claim_values) do headers:replace(h, v) end
  headers:replace(CONFIG.qos_header, class)

  -- mesh.session v2: bound to the issue time, the method and x-request-id
  local t = tostring(os.time())
  local names, parts = {}, {"mcp-session-v2\nt:" .. t .. "\n:method:" .. (headers:get(":method") or "")
                             .. "\nx-request-id:" .. (headers:get("x-request-id") or "") .. "\n"}
  for _, h in ipairs(CONFIG.signed) do
    local v = (h == CONFIG.qos_header) and class or claim_values[h]
    if v then
      names[#names + 1] = h
      parts[#parts + 1] = h .. ":" .. v .. "\n"
    end
  end
  headers:replace(CONFIG.sig_header, "v2;t=" .. t .. ";h=" .. concat(names, ",") .. ";s=" .. hmac_hex(concat(parts)))
  pcall(function() handle:clearRouteCache() end)
end

function envoy_on_response(handle)
  local headers = handle:headers()
  local grpc = headers:get("grpc-status")
  local class
  if grpc then
    class = CONFIG.grpc[grpc] or CONFIG.grpc_default
  else
    local status = tonumber(headers:get(":status") or "200")
    class = CONFIG.http[tostring(status)] or (status < 400 and "ok" or status < 500 and "client" or "server")
  end
  headers:replace(CONFIG.error_header, class)
end
