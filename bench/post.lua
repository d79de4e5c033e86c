-- wrk: one authenticated MCP POST, the body and headers from the environment.
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Accept"] = "application/json, text/event-stream"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_KEY")
local sid = os.getenv("BENCH_SESSION")
if sid and sid ~= "" then wrk.headers["Mcp-Session-Id"] = sid end
wrk.headers["MCP-Protocol-Version"] = "2025-06-18"

function done(summary, latency, requests)
  io.write(string.format('BENCHJSON {"requests":%d,"duration_us":%d,"errors":%d,' ..
    '"non2xx":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.status + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(99)))
end
