// What bench/node/rate.js and bench/node/federation.js share: single pushes paced to a
// total rate, and the measured window with its latency and CPU figures.
"use strict";

// Send time in ns, zero-padded to 20 characters, at the head of each message.
function stamp(pad) {
  return process.hrtime.bigint().toString().padStart(20, "0") + pad;
}

function latencyOf(message) {
  return process.hrtime.bigint() - BigInt(message.slice(0, 20));
}

function percentile(sorted, q) {
  if (!sorted.length) return NaN;
  return Number(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]) / 1e6;
}

// One push per producer every queues/rate seconds, the producers phase-shifted so the
// total is even. `push(i)` makes producer i's push; returns a stop function.
function pace(count, rate, push) {
  const interval = (count / rate) * 1000; // ms between pushes on one producer
  const origin = performance.now();
  const timers = [];
  let running = true;
  for (let i = 0; i < count; i++) {
    let due = origin + (interval * i) / count;
    const tick = () => {
      if (!running) return;
      push(i);
      due += interval;
      timers[i] = setTimeout(tick, Math.max(0, due - performance.now()));
    };
    timers[i] = setTimeout(tick, Math.max(0, due - performance.now()));
  }
  return () => {
    running = false;
    timers.forEach((t) => clearTimeout(t));
  };
}

// After `warmup` s, record for `seconds` s: `counts()` gives the counters to take the
// difference of, `state.recording` says whether latencies are kept. Prints "measuring",
// then one JSON line (the counters' growth, latency percentiles, CPU), then `done()`.
function measure({ warmup, seconds }, state, latencies, counts, done) {
  setTimeout(() => {
    const cpu0 = process.cpuUsage();
    const before = counts();
    const t0 = performance.now();
    state.recording = true;
    console.log("measuring");
    setTimeout(() => {
      state.recording = false;
      const elapsed = (performance.now() - t0) / 1000;
      const cpu = process.cpuUsage(cpu0);
      const after = counts();
      const grown = Object.fromEntries(Object.keys(after).map((k) => [k, after[k] - before[k]]));
      const sorted = latencies.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
      console.log(JSON.stringify({
        seconds: elapsed,
        ...grown,
        p50_ms: percentile(sorted, 0.5),
        p99_ms: percentile(sorted, 0.99),
        p999_ms: percentile(sorted, 0.999),
        max_ms: percentile(sorted, 1),
        client_cpu: (cpu.user + cpu.system) / 1e6 / elapsed,
        client_sys_share: cpu.system / Math.max(1, cpu.user + cpu.system),
      }));
      done();
    }, seconds * 1000);
  }, warmup * 1000);
}

module.exports = { stamp, latencyOf, percentile, pace, measure };
