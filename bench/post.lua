-- wrk: one authenticated MCP POST, the body and headers from the environment.
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_KEY")
local sid = os.getenv("BENCH_SESSION")
if sid and sid ~= "" then wrk.headers["Mcp-Session-Id"] = sid end
-- BENCH_VERSION: the protocol version (2026-07-28: stateless, with the headers that
-- era wants, BENCH_METHOD and BENCH_NAME).
wrk.headers["MCP-Protocol-Version"] = os.getenv("BENCH_VERSION") or "2025-06-18"
local method = os.getenv("BENCH_METHOD")
if method and method ~= "" then wrk.headers["Mcp-Method"] = method end
local name = os.getenv("BENCH_NAME")
if name and name ~= "" then wrk.headers["Mcp-Name"] = name end

-- Answers that are errors (a JSON-RPC error, or a tool result with isError: a rate
-- limit, say) are counted per thread, so a fast refusal never passes for throughput.
local threads = {}
function setup(thread) table.insert(threads, thread) end
bad = 0
function response(status, headers, body)
  if string.find(body, '"isError":true', 1, true) or string.find(body, '"error":{', 1, true) then
    bad = bad + 1
  end
end

function done(summary, latency, requests)
  local failed = 0
  for _, t in ipairs(threads) do failed = failed + t:get("bad") end
  io.write(string.format('BENCHJSON {"requests":%d,"duration_us":%d,"errors":%d,' ..
    '"non2xx":%d,"error_answers":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.status + summary.errors.timeout,
    summary.errors.status, failed, latency:percentile(50), latency:percentile(99)))
end
