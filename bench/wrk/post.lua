-- wrk script: POST one chat completion per request.
-- The body comes from BENCH_BODY; BENCH_AUTHORIZATION, when set, becomes the
-- Authorization header (the router needs an API key, the sim worker does not).
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
local auth = os.getenv("BENCH_AUTHORIZATION")
if auth ~= nil and auth ~= "" then
  wrk.headers["Authorization"] = auth
end
-- BENCH_HEADERS: more headers, one "Name: value" per line (the peer gateway's
-- routing headers).
local extra = os.getenv("BENCH_HEADERS")
if extra ~= nil then
  for line in string.gmatch(extra, "[^\n]+") do
    local name, value = string.match(line, "^([^:]+):%s*(.*)$")
    if name ~= nil then
      wrk.headers[name] = value
    end
  end
end
