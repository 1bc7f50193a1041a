-- gRPC-Web request framing check (envoy.filters.http.lua, before grpc_web).
--
-- A gRPC-Web body is whole length-prefixed frames: flags(1) length(4) payload.
-- A body that is not -- a frame cut short, no message at all -- is answered
-- here with a gRPC error, because the upstream may never answer it: grpcio's
-- asyncio server waits forever for the rest of a truncated message, and with
-- route timeouts off (istiod's default) the caller would hang with it.
--
-- Only bodies with a content-length up to LIMIT are checked (buffered whole;
-- browsers send gRPC-Web bodies at once, with a length); larger ones stream
-- through unchecked, within the listener's buffer limit either way, unless
-- the length says the message is over MAX_MESSAGE: then RESOURCE_EXHAUSTED,
-- from the headers alone. A body without a length (chunked, h2c) streams
-- through; the HCM's stream idle timeout bounds it if it stalls.
local LIMIT = __LIMIT__
local MAX_MESSAGE = __MAX_MESSAGE__
local INVALID_ARGUMENT = "3"
local RESOURCE_EXHAUSTED = "8"

local ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local B64 = {}
for i = 1, 64 do B64[ALPHABET:byte(i)] = i - 1 end

local function base64(s)
  local out = {}
  for i = 1, #s, 3 do
    local a, b, c = s:byte(i, i + 2)
    local n = a * 65536 + (b or 0) * 256 + (c or 0)
    local q = {math.floor(n / 262144) % 64, math.floor(n / 4096) % 64, math.floor(n / 64) % 64, n % 64}
    out[#out + 1] = ALPHABET:sub(q[1] + 1, q[1] + 1) .. ALPHABET:sub(q[2] + 1, q[2] + 1)
      .. (b and ALPHABET:sub(q[3] + 1, q[3] + 1) or "=") .. (c and ALPHABET:sub(q[4] + 1, q[4] + 1) or "=")
  end
  return table.concat(out)
end

-- grpc-web-text: base64, possibly several separately padded chunks. nil when
-- not base64 (then grpc_web itself rejects the request).
local function unbase64(s)
  local out, acc, bits = {}, 0, 0
  for i = 1, #s do
    local c = s:byte(i)
    local v = B64[c]
    if v then
      acc, bits = acc * 64 + v, bits + 6
      if bits >= 8 then
        bits = bits - 8
        local byte = math.floor(acc / 2 ^ bits)
        out[#out + 1] = string.char(byte)
        acc = acc - byte * 2 ^ bits
      end
    elseif c == 61 then           -- '=': the end of one chunk
      acc, bits = 0, 0
    elseif c ~= 10 and c ~= 13 and c ~= 32 and c ~= 9 then
      return nil
    end
  end
  return table.concat(out)
end

-- What is wrong with the frames of `b`, or nil.
local function framing_problem(b)
  local pos, n, frames = 1, #b, 0
  while pos <= n do
    if n - pos + 1 < 5 then
      return string.format("body ends inside a frame header (%d of 5 bytes at offset %d)", n - pos + 1, pos - 1)
    end
    local flags, b1, b2, b3, b4 = b:byte(pos, pos + 4)
    if flags ~= 0 and flags ~= 1 then
      return string.format("frame at offset %d has flags 0x%02x; a request carries only message frames", pos - 1, flags)
    end
    local length = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
    if pos + 4 + length > n then
      return string.format("frame at offset %d says %d bytes, %d follow", pos - 1, length, n - pos - 4)
    end
    pos, frames = pos + 5 + length, frames + 1
  end
  if frames == 0 then
    return "no message frame; unary and server-streaming calls send one request message"
  end
  return nil
end

-- A gRPC-Web answer with no message, only the trailer frame (flags 0x80).
-- (Not trailers-only: Envoy drops content-type from a local reply with an
-- empty body, and a gRPC-Web client needs it.)
local function grpc_web_error(status, message)
  local block = "grpc-status:" .. status .. "\r\ngrpc-message:" .. message .. "\r\n"
  local n = #block
  return string.char(128, math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256,
                     math.floor(n / 256) % 256, n % 256) .. block
end

local function reply(handle, ctype, text, status, message)
  local out = grpc_web_error(status, message)
  handle:respond({[":status"] = "200", ["content-type"] = ctype:match("^[^;]+")},
                 text and base64(out) or out)
end

function envoy_on_request(handle)
  local headers = handle:headers()
  local ctype = headers:get("content-type") or ""
  if ctype:sub(1, 20) ~= "application/grpc-web" then
    return
  end
  local length = tonumber(headers:get("content-length") or "")
  if length == nil then
    return
  end
  local text = ctype:sub(1, 25) == "application/grpc-web-text"
  -- The one request message (unary and server-streaming calls send one) is at
  -- least this long: the body less one frame header (base64: 3 bytes per 4).
  local message = (text and math.floor(length * 3 / 4) or length) - 5
  if message > MAX_MESSAGE then
    reply(handle, ctype, text, RESOURCE_EXHAUSTED, string.format(
      "gRPC-Web request message of about %d bytes is over the gateway's limit of %d", message, MAX_MESSAGE))
    return
  end
  if length > LIMIT then
    return
  end
  local body = handle:body()
  local bytes = body and body:getBytes(0, body:length()) or ""
  if text then
    bytes = unbase64(bytes)
    if bytes == nil then
      return
    end
  end
  local problem = framing_problem(bytes)
  if problem then
    reply(handle, ctype, text, INVALID_ARGUMENT, "malformed gRPC-Web request: " .. problem)
  end
end
