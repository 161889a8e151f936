// The gateway benchmark's workload from this client, for bench/clients_bench.py: prints one
// JSON line of figures. `node dist/bench/flood.js '<json options>'`
//   flood: `queues` queues, producers push batches of `batch` (`size`-byte messages) with at
//          most `window` in flight per queue, at-most-once consumers; measured for `seconds`
//          after `warmup`.
//   rate:  single-message pushes at `rate` msg/s over 10 queues; end-to-end latency.

import { BusClient, type QueueHandle } from "../src/index.js";

interface Options {
  url: string;
  secret: string;
  scenario: "flood" | "rate";
  queues: number;
  seconds: number;
  warmup: number;
  batch: number;
  window: number;
  size: number;
  prefetch: number;
  rate: number;
  tag: string;
}

const options = JSON.parse(process.argv[2] ?? "{}") as Options;
const client = new BusClient({ url: options.url, secret: options.secret });
const latencies: number[] = [];
let recording = false;

function payload(): Uint8Array {
  const bytes = new Uint8Array(Math.max(8, options.size));
  new DataView(bytes.buffer).setBigInt64(0, process.hrtime.bigint(), true);
  return bytes;
}

function latencyMs(bytes: Uint8Array): number {
  const sent = new DataView(bytes.buffer, bytes.byteOffset).getBigInt64(0, true);
  return Number(process.hrtime.bigint() - sent) / 1e6;
}

async function attach(count: number, kind: string): Promise<QueueHandle[]> {
  const queues = Array.from({ length: count }, (_, i) =>
    client.queue(`${options.tag}-${kind}-${i}`),
  );
  for (const queue of queues) {
    await queue.attach({ ttlSeconds: 60 });
  }
  return queues;
}

function startConsumers(queues: QueueHandle[], consumed: number[], onTake: () => void) {
  return queues.map((queue, lane) => {
    const consumer = queue.consume({ prefetch: options.prefetch });
    const done = (async () => {
      for await (const delivery of consumer) {
        if (recording) {
          latencies.push(latencyMs(delivery.message.payload));
        }
        consumed[lane] = (consumed[lane] ?? 0) + 1;
        onTake();
      }
    })();
    return { consumer, done };
  });
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const sum = (values: number[]) => values.reduce((a, b) => a + b, 0);

async function flood(): Promise<Record<string, number>> {
  const queues = await attach(options.queues, "flood");
  const sent = queues.map(() => 0);
  const consumed = queues.map(() => 0);
  const wakers = queues.map(() => undefined as (() => void) | undefined);
  let running = true;
  const consumers = startConsumers(queues, consumed, () => {
    wakers.forEach((wake, lane) => {
      if (wake && (sent[lane] ?? 0) - (consumed[lane] ?? 0) <= options.window / 2) {
        wakers[lane] = undefined;
        wake();
      }
    });
  });
  const producers = queues.map(async (queue, lane) => {
    while (running) {
      while (running && (sent[lane] ?? 0) - (consumed[lane] ?? 0) + options.batch > options.window) {
        await new Promise<void>((resolve) => {
          wakers[lane] = resolve;
        });
      }
      if (!running) {
        return;
      }
      sent[lane] = (sent[lane] ?? 0) + options.batch;
      await queue.pushBatch(Array.from({ length: options.batch }, payload));
    }
  });
  await sleep(options.warmup * 1000);
  const [sent0, consumed0] = [sum(sent), sum(consumed)];
  recording = true;
  const started = performance.now();
  await sleep(options.seconds * 1000);
  const seconds = (performance.now() - started) / 1000;
  const figures = { seconds, pushed: sum(sent) - sent0, consumed: sum(consumed) - consumed0 };
  recording = false;
  running = false;
  wakers.forEach((wake) => wake?.());
  await Promise.allSettled(producers);
  await Promise.all(consumers.map((c) => c.consumer.stop()));
  return figures;
}

async function rate(): Promise<Record<string, number>> {
  const queues = await attach(10, "rate");
  const consumed = queues.map(() => 0);
  const consumers = startConsumers(queues, consumed, () => undefined);
  await sleep(500);
  recording = true;
  const interval = 1000 / options.rate;
  const started = performance.now();
  const pushes: Promise<unknown>[] = [];
  let sent = 0;
  while (performance.now() - started < options.seconds * 1000) {
    const due = started + sent * interval;
    const now = performance.now();
    if (due > now) {
      await sleep(due - now);
    }
    pushes.push((queues[sent % queues.length] as QueueHandle).push(payload()));
    sent += 1;
  }
  // A saturated gateway fails calls (deadline, cancelled): counted, not fatal.
  const failed = (await Promise.allSettled(pushes)).filter((r) => r.status === "rejected").length;
  await sleep(500);
  const seconds = (performance.now() - started) / 1000;
  recording = false;
  await Promise.all(consumers.map((c) => c.consumer.stop()));
  return { seconds, pushed: sent - failed, consumed: sum(consumed), failed };
}

function percentile(q: number): number {
  const ordered = [...latencies].sort((a, b) => a - b);
  return ordered.length === 0 ? Number.NaN : (ordered[Math.min(ordered.length - 1, Math.floor(q * ordered.length))] as number);
}

const figures = options.scenario === "flood" ? await flood() : await rate();
console.log(JSON.stringify({ ...figures, p50_ms: percentile(0.5), p99_ms: percentile(0.99) }));
await client.close();
