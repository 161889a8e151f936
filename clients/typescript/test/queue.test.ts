// The client against a real gateway process (and its redis-server) on free ports.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import {
  BusClient,
  InvalidNameError,
  MessageTooLargeError,
  NotFoundError,
  ProducerFencedError,
  UnauthenticatedError,
} from "../src/index.js";
import { Deployment, liveGateway } from "./support.js";

describe("queues through a live gateway", () => {
  const live = liveGateway();

  test("10,000 pushed in batches are consumed at-least-once, each id once and in order", async () => {
    const { client } = live();
    const orders = client.queue("ts-orders");
    assert.equal(await orders.attach(), true);
    const pushed: bigint[] = [];
    for (let start = 0; start < 10_000; start += 500) {
      const batch = Array.from({ length: 500 }, (_, i) => ({ n: start + i }));
      pushed.push(...(await orders.pushBatch(batch)));
    }
    assert.deepEqual(pushed, Array.from({ length: 10_000 }, (_, i) => BigInt(i + 1)));

    const seen: bigint[] = [];
    const consumer = orders.consume({ mode: "at-least-once", max: 10_000, prefetch: 500 });
    for await (const delivery of consumer) {
      assert.deepEqual(delivery.data, { n: Number(delivery.id) - 1 });
      seen.push(delivery.id);
      void delivery.ack();
    }
    assert.deepEqual(seen, pushed);
    await consumer.stop();
    assert.equal((await orders.info()).count, 0n); // every ack arrived
    await orders.detach();
  });

  test("at-least-once, a delivery whose lease ran out on the way is not handed out: it comes again", async () => {
    // One message a batch, each handled in 0.8 s under a 2 s lease: the gateway reads and
    // sends all five at once, so the fourth and fifth lapse while they wait in the
    // stream's buffers here (any consumer may claim them); they come again, redelivered.
    const { client } = live();
    const queue = client.queue("ts-lease-ahead");
    await queue.attach();
    await queue.pushBatch(["1", "2", "3", "4", "5"]);
    const consumer = queue.consume({ mode: "at-least-once", prefetch: 1, visibilityTimeoutSeconds: 2 });
    const handled = new Map<bigint, number>();
    for await (const delivery of consumer) {
      await new Promise((resolve) => setTimeout(resolve, 800));
      await delivery.ack();
      handled.set(delivery.id, delivery.deliveryCount);
      if (handled.size === 5) {
        break;
      }
    }
    assert.ok(consumer.lapsed >= 1, "a delivery that waited past its lease was handed out");
    assert.ok([...handled.values()].some((count) => count > 1), "the lapsed ones came again");
    await queue.detach();
  });

  test("a retried push with the same request id is stored once", async () => {
    const { client } = live();
    const queue = client.queue("ts-dedupe");
    await queue.attach();
    const first = await queue.pushBatch(["a", "b"], { requestId: "order-17" });
    const again = await queue.pushBatch(["a", "b"], { requestId: "order-17" });
    assert.deepEqual(again, first);
    assert.equal((await queue.info()).count, 2n);
    await queue.detach();
  });

  test("a producer's sequence is stored once, with no window, and an older epoch is fenced", async () => {
    const { client } = live();
    const queue = client.queue("ts-producer");
    await queue.attach();
    const old = { name: "ts-etl", epoch: 1n };
    const first = await queue.pushBatch(["a", "b"], { producer: { ...old, sequence: 7n } });
    const again = await queue.pushBatch(["a", "b"], { producer: { ...old, sequence: 7n } });
    assert.deepEqual(again, first);
    assert.equal(await queue.push("older", { producer: { ...old, sequence: 3n } }), 0n);
    await queue.push("new", { producer: { name: "ts-etl", epoch: 2n, sequence: 0n } });
    await assert.rejects(queue.push("late", { producer: { ...old, sequence: 8n } }), (error: unknown) => {
      assert.ok(error instanceof ProducerFencedError);
      assert.equal(error.currentEpoch, 2n);
      return true;
    });
    assert.equal((await queue.info()).count, 3n);
    await queue.detach();
  });

  test("replay reads from an id, and max ends the consumer", async () => {
    const { client } = live();
    const log = client.queue("ts-log");
    await log.attach();
    await log.pushBatch(["one", "two", "three", "four", "five"], { headers: { source: "ts" } });
    const read: [bigint, unknown][] = [];
    for await (const delivery of log.consume({ mode: "replay", fromId: 2n, max: 3 })) {
      assert.equal(delivery.headers.source, "ts");
      read.push([delivery.id, delivery.data]);
    }
    assert.deepEqual(read, [
      [2n, "two"],
      [3n, "three"],
      [4n, "four"],
    ]);
    assert.equal((await log.info()).count, 5n); // replay is non-destructive
    await log.detach();
  });

  test("errors are typed from the status and ErrorInfo", async () => {
    const { client, deployment } = live();
    const wrong = new BusClient({ url: deployment.url, secret: "not-the-secret-at-all" });
    await assert.rejects(wrong.queue("ts-x").attach(), UnauthenticatedError);
    await assert.rejects(client.queue("bad name").attach(), (error: unknown) => {
      assert.ok(error instanceof InvalidNameError);
      assert.equal(error.reason, "INVALID_NAME");
      assert.equal(error.metadata.name, "bad name");
      return true;
    });
    const big = client.queue("ts-big");
    await big.attach();
    await assert.rejects(big.push(new Uint8Array(2 * 1024 * 1024)), (error: unknown) => {
      assert.ok(error instanceof MessageTooLargeError);
      assert.equal(error.limit, 1024 * 1024); // the bus's max_message_bytes
      assert.ok(error.size > error.limit);
      return true;
    });
    await big.destroy();
    await assert.rejects(client.queue("ts-never-attached").push("x"), NotFoundError);
  });

  test("pushes go over one stream, each answered on its own; a large one by a call", async () => {
    const { client } = live();
    const queue = client.queue("ts-coalesced");
    await queue.attach();
    const calls = client.pushes.calls;
    const streams = client.stream.opened;
    const outcomes = await Promise.allSettled([
      queue.push("first"),
      queue.push("second"),
      client.queue("ts-not-attached").push("refused"),
      queue.push(new Uint8Array(2 * 1024 * 1024)), // too large for the stream: a call
      queue.push("third"),
    ]);
    assert.equal(client.pushes.calls - calls, 1);
    assert.ok(client.stream.opened - streams <= 1);
    const values = outcomes.map((o) => (o.status === "fulfilled" ? o.value : o.reason));
    assert.deepEqual(values.filter((v) => typeof v === "bigint"), [1n, 2n, 3n]);
    assert.ok(values[2] instanceof NotFoundError, String(values[2]));
    assert.ok(values[3] instanceof MessageTooLargeError, String(values[3]));
    assert.equal((values[3] as MessageTooLargeError).limit, 1024 * 1024); // from the Status's ErrorInfo
    assert.equal((await queue.info()).count, 3n);
    await queue.detach();
  });

  test("plaintext to a host that is not loopback needs an explicit opt-in", () => {
    assert.throws(() => new BusClient({ url: "http://10.0.0.7:8443" }), /refusing plaintext/);
    assert.ok(new BusClient({ url: "http://10.0.0.7:8443", allowPlaintext: true }));
  });
});

describe("a consumer across a gateway crash", () => {
  test("resumes by itself after SIGKILL and a restart: nothing acked lost, unacked redelivered", async () => {
    const deployment = await new Deployment().start();
    const client = new BusClient({ url: deployment.url, secret: deployment.secret, timeoutMs: 5000 });
    try {
      const jobs = client.queue("ts-jobs");
      await jobs.attach({ ttlSeconds: 60 });
      const batch = (from: number) => Array.from({ length: 1000 }, (_, n) => ({ n: from + n }));
      let ids = await jobs.pushBatch(batch(0));
      const acked = new Set<bigint>();
      const counts = new Map<bigint, number>();
      const consumer = jobs.consume({
        mode: "at-least-once",
        prefetch: 50,
        visibilityTimeoutSeconds: 2,
      });
      let crashed = false;
      for await (const delivery of consumer) {
        counts.set(delivery.id, delivery.deliveryCount);
        if (!crashed && acked.size === 500) {
          crashed = true;
          await deployment.killGateway(); // this delivery and the prefetched ones stay unacked
          await deployment.startGateway();
          // Pushed after the crash, these reach the consumer only on a resumed stream (a
          // slow consumer may hold the first thousand in its stream's buffers).
          ids = [...ids, ...(await jobs.pushBatch(batch(1000)))];
          continue;
        }
        await delivery.ack();
        acked.add(delivery.id);
        if (acked.size === ids.length) {
          break;
        }
      }
      assert.ok(consumer.resumes >= 1, "the stream was reopened");
      assert.deepEqual([...acked].sort((a, b) => Number(a - b)), ids);
      const redelivered = [...counts.values()].filter((c) => c > 1).length;
      assert.ok(redelivered >= 1, "the deliveries unacked at the crash came again");
      assert.equal((await jobs.info()).count, 0n);
    } finally {
      await client.close();
      await deployment.stop();
    }
  });
});
