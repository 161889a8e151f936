// The federation runs of bench/federation_bench.py on the Node.js busmq (npm `busmq`): its
// WebSocket federation (`bus.federate`), on the same workload and the same Redis servers.
//
//   node bench/node/federation.js --role server --redis redis://127.0.0.1:A --port P
//       a bus on Redis A that accepts federation on http://127.0.0.1:P; prints "ready"
//   node bench/node/federation.js --role client --redis redis://127.0.0.1:B \
//       --url http://127.0.0.1:P --scenario rate --rate 1000 [--seconds 5]
//       a bus on Redis B that federates --queues queues of the server's; pushes through
//       one federated object per queue and consumes through another (at-most-once, the
//       seed's default). "rate": single pushes paced to --rate msg/s in total; "flood":
//       --batch pushes at a time, at most --window in flight per queue. Prints
//       "measuring", then one JSON line of figures.
"use strict";

const http = require("http");
const Bus = require("busmq");
const { stamp, latencyOf, pace, measure } = require("./window");

const SECRET = "bench-secret-0123456789";

function options(argv) {
  const opts = {
    role: "", redis: "", port: 0, url: "", scenario: "rate", queues: 10, rate: 1000,
    seconds: 5, warmup: 1, size: 32, batch: 100, window: 2000, pool: 2, tag: "",
  };
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, "");
    if (!(key in opts)) throw new Error(`unknown option ${argv[i]}`);
    opts[key] = typeof opts[key] === "number" ? Number(argv[i + 1]) : argv[i + 1];
  }
  if (!opts.redis) throw new Error("--redis URL is required");
  return opts;
}

function server(opts) {
  const httpServer = http.createServer();
  const bus = Bus.create({ redis: [opts.redis], federate: { server: httpServer, secret: SECRET } });
  bus.on("error", (err) => { console.error(`server bus error: ${err}`); });
  bus.on("online", () => {
    httpServer.listen(opts.port, "127.0.0.1", () => console.log("ready"));
  });
  process.on("SIGTERM", () => { bus.disconnect(); httpServer.close(); process.exit(0); });
  bus.connect();
}

function federated(bus, name, url) {
  return new Promise((resolve, reject) => {
    const fed = bus.federate(bus.queue(name), url);
    fed.on("error", reject);
    fed.on("unauthorized", () => reject(new Error("unauthorized")));
    fed.on("ready", (queue) => {
      queue.on("error", (err) => { console.error(`queue error: ${err}`); });
      queue.once("attached", () => resolve(queue));
      queue.attach();
    });
  });
}

function client(opts) {
  const bus = Bus.create({
    redis: [opts.redis],
    federate: { urls: [opts.url], poolSize: opts.pool, secret: SECRET },
  });
  const pad = "x".repeat(Math.max(0, opts.size - 20));
  const latencies = [];
  const consumed = new Array(opts.queues).fill(0);
  const sent = new Array(opts.queues).fill(0);
  const state = { recording: false };
  let running = true;

  bus.on("error", (err) => { console.error(`client bus error: ${err}`); });
  bus.on("online", async () => {
    const producers = [];
    const refill = (i) => {
      while (running && sent[i] - consumed[i] + opts.batch <= opts.window) {
        for (let k = 0; k < opts.batch; k++) producers[i].push(stamp(pad));
        sent[i] += opts.batch;
      }
    };
    for (let i = 0; i < opts.queues; i++) {
      const name = `node-${opts.tag || process.pid}-${opts.scenario}-${i}`;
      const consumer = await federated(bus, name, opts.url);
      consumer.on("message", (message) => {
        if (state.recording) latencies.push(latencyOf(message));
        consumed[i]++;
        if (opts.scenario === "flood") refill(i);
      });
      consumer.consume();
      producers.push(await federated(bus, name, opts.url));
    }
    let stop = () => {};
    if (opts.scenario === "flood") {
      producers.forEach((_, i) => refill(i));
    } else {
      stop = pace(opts.queues, opts.rate, (i) => {
        producers[i].push(stamp(pad));
        sent[i]++;
      });
    }
    const total = (counts) => counts.reduce((a, b) => a + b, 0);
    const counts = () => ({ pushed: total(sent), consumed: total(consumed) });
    measure(opts, state, latencies, counts, () => {
      running = false;
      stop();
      bus.disconnect();
      setTimeout(() => process.exit(0), 200);
    });
  });
  bus.connect();
}

const opts = options(process.argv.slice(2));
if (opts.role === "server") server(opts);
else if (opts.role === "client") client(opts);
else throw new Error("--role server|client");
