// The fixed-rate run of bench/core_bench.py on the Node.js busmq (npm `busmq`), so both are
// measured in one run against one Redis: --queues queues, single pushes paced to --rate
// msg/s in total (phase-shifted per queue), one consumer per queue (reliable mode by
// default: each message acked), --size-byte messages stamped with their send time.
// Prints "measuring" when the measured window starts, then one JSON line of figures.
//
//   node bench/node/rate.js --redis redis://127.0.0.1:PORT [--queues 100] [--rate 5000]
"use strict";

const Bus = require("busmq");
const { stamp, latencyOf, pace, measure } = require("./window");

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

function main() {
  const opts = options(process.argv.slice(2));
  const bus = Bus.create({ redis: [opts.redis] });
  const pad = "x".repeat(Math.max(0, opts.size - 20));
  const latencies = [];
  const state = { recording: false };
  let consumed = 0;
  let sent = 0;

  bus.on("error", (err) => { console.error(`bus error: ${err}`); });
  bus.on("online", () => {
    let ready = 0;
    const producers = [];
    for (let i = 0; i < opts.queues; i++) {
      const name = `bench-node-${process.pid}-${i}`;
      const consumer = bus.queue(name);
      consumer.on("error", (err) => { console.error(`consumer error: ${err}`); });
      consumer.on("message", (message, id) => {
        if (state.recording) latencies.push(latencyOf(message));
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
    const stop = pace(opts.queues, opts.rate, (i) => {
      producers[i].push(stamp(pad));
      sent++;
    });
    measure(opts, state, latencies, () => ({ consumed, sent }), () => {
      stop();
      bus.disconnect();
      setTimeout(() => process.exit(0), 200);
    });
  }

  bus.connect();
}

main();
