-- wrk: one authenticated REST GET (the URL's path), the key from the environment.
wrk.method = "GET"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_KEY")

function done(summary, latency, requests)
  io.write(string.format('BENCHJSON {"requests":%d,"duration_us":%d,"errors":%d,' ..
    '"non2xx":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration,
    summary.errors.connect + summary.errors.read + summary.errors.write +
    summary.errors.status + summary.errors.timeout,
    summary.errors.status, latency:percentile(50), latency:percentile(99)))
end
