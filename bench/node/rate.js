// The fixed-rate run of bench/core_bench.py on the Node.js busmq (npm `busmq`), so both are
// measured in one run against one Redis: --queues queues, single pushes paced to --rate
// msg/s in total (phase-shifted per queue), one consumer per queue (reliable mode by
// default: each message acked), --size-byte messages stamped with their send time.
// Prints "measuring" when the measured window starts, then one JSON line of figures.
//
//   node bench/node/rate.js --redis redis://127.0.0.1:PORT [--queues 100] [--rate 5000]
"use strict";

const Bus = require("busmq");

function options(argv) {
  const opts = { redis: "", queues: 100, rate: 5000, seconds: 5, warmup: 1, size: 32, reliable: true };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    if (!(key in opts)) throw new Error(`unknown option ${argv[i]}`);
    opts[key] = typeof opts[key] === "number" ? Number(argv[i + 1])
      : typeof opts[key] === "boolean" ? argv[i + 1] === "true" : argv[i + 1];
  }
  if (!opts.redis) throw new Error("--redis URL is required");
  return opts;
}

function percentile(sorted, q) {
  if (!sorted.length) return NaN;
  return Number(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]) / 1e6;
}

function main() {
  const opts = options(process.argv.slice(2));
  const bus = Bus.create({ redis: [opts.redis] });
  const pad = "x".repeat(Math.max(0, opts.size - 20));
  const latencies = [];
  let recording = false;
  let running = true;
  let consumed = 0;
  let sent = 0;
  const timers = [];

  bus.on("error", (err) => { console.error(`bus error: ${err}`); });
  bus.on("online", () => {
    let ready = 0;
    const producers = [];
    for (let i = 0; i < opts.queues; i++) {
      const name = `bench-node-${process.pid}-${i}`;
      const consumer = bus.queue(name);
      consumer.on("error", (err) => { console.error(`consumer error: ${err}`); });
      consumer.on("message", (message, id) => {
        const stamp = BigInt(message.slice(0, 20));
        if (recording) latencies.push(process.hrtime.bigint() - stamp);
        consumed++;
        if (opts.reliable) consumer.ack(id);
      });
      consumer.on("attached", () => {
        consumer.consume({ reliable: opts.reliable });
        const producer = bus.queue(name);
        producer.on("error", (err) => { console.error(`producer error: ${err}`); });
        producer.on("attached", () => {
          producers[i] = producer;
          if (++ready === opts.queues) start(producers);
        });
        producer.attach();
      });
      consumer.attach();
    }
  });

  function start(producers) {
    const interval = (opts.queues / opts.rate) * 1000; // ms between pushes on one queue
    const origin = performance.now();
    producers.forEach((producer, i) => {
      let due = origin + (interval * i) / opts.queues;
      const tick = () => {
        if (!running) return;
        const stamp = process.hrtime.bigint().toString().padStart(20, "0");
        producer.push(stamp + pad);
        sent++;
        due += interval;
        timers[i] = setTimeout(tick, Math.max(0, due - performance.now()));
      };
      timers[i] = setTimeout(tick, Math.max(0, due - performance.now()));
    });
    setTimeout(() => {
      const cpu0 = process.cpuUsage();
      const consumed0 = consumed;
      const t0 = performance.now();
      recording = true;
      console.log("measuring");
      setTimeout(() => {
        recording = false;
        const seconds = (performance.now() - t0) / 1000;
        const cpu = process.cpuUsage(cpu0);
        const sorted = latencies.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
        console.log(JSON.stringify({
          seconds,
          consumed: consumed - consumed0,
          sent,
          p50_ms: percentile(sorted, 0.5),
          p99_ms: percentile(sorted, 0.99),
          p999_ms: percentile(sorted, 0.999),
          max_ms: percentile(sorted, 1),
          client_cpu: (cpu.user + cpu.system) / 1e6 / seconds,
          client_sys_share: cpu.system / Math.max(1, cpu.user + cpu.system),
        }));
        running = false;
        timers.forEach((t) => clearTimeout(t));
        bus.disconnect();
        setTimeout(() => process.exit(0), 200);
      }, opts.seconds * 1000);
    }, opts.warmup * 1000);
  }

  bus.connect();
}

main();
