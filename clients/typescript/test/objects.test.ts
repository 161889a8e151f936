// The rest of the object kinds through a live gateway: the processing controls, dead
// letters, listings and browsing of queues, and persistables shared with Python.

import assert from "node:assert/strict";
import { create, toBinary } from "@bufbuild/protobuf";
import {
  FieldDescriptorProto_Label,
  FieldDescriptorProto_Type,
  FileDescriptorSetSchema,
} from "@bufbuild/protobuf/wkt";
import { execFile } from "node:child_process";
import { describe, test } from "node:test";
import { promisify } from "node:util";
import { type Delivery, SchemaError, SchemaIncompatibleError } from "../src/index.js";
import { CHILD_MS, liveGateway, PYTHON, ROOT } from "./support.js";

const run = promisify(execFile);

/** Run `code` in Python with a bus on the deployment's Redis as `bus`; returns its stdout. */
async function python(redisPort: number, code: string): Promise<string> {
  const script = [
    "import asyncio, json",
    "from busmq import Bus, BusSettings",
    "async def main(bus):",
    ...code.trim().split("\n").map((line) => `    ${line}`),
    "async def entry():",
    `    async with Bus(BusSettings(redis_urls=("redis://127.0.0.1:${redisPort}",))) as bus:`,
    "        await main(bus)",
    "asyncio.run(entry())",
  ].join("\n");
  const { stdout } = await run(PYTHON, ["-c", script], { cwd: ROOT, timeout: CHILD_MS });
  return stdout.trim();
}

async function next(iterator: AsyncIterator<Delivery>): Promise<Delivery> {
  const step = await iterator.next();
  assert.ok(!step.done, "the consumer ended");
  return step.value;
}

describe("controls, dead letters, listings and persistables through a live gateway", () => {
  const live = liveGateway();

  test("pause, rate limit, max deliveries, nack with a delay, reject and requeue", async () => {
    const { client } = live();
    const jobs = client.queue("ts-jobs");
    await jobs.attach();
    await jobs.pause();
    await jobs.setRateLimit({ limit: 50, perSeconds: 2 });
    await jobs.setMaxDeliveries(2);
    let info = await jobs.info();
    assert.equal(info.paused, true);
    assert.deepEqual(info.rateLimit, { limit: 50, perSeconds: 2 });
    assert.equal(info.maxDeliveries, 2);
    await jobs.setRateLimit(null);
    await jobs.resume();
    info = await jobs.info();
    assert.equal(info.paused, false);
    assert.equal(info.rateLimit, undefined);

    await jobs.pushBatch(["poison", "flaky", "fine"]);
    const consumer = jobs.consume({ mode: "at-least-once", prefetch: 1 });
    const deliveries = consumer[Symbol.asyncIterator]();
    const poison = await next(deliveries);
    assert.equal(poison.data, "poison");
    await poison.reject("cannot parse");
    const flaky = await next(deliveries);
    await flaky.nack({ delaySeconds: 0.5, error: "try later" });
    assert.equal((await jobs.info()).delayed, 1n);
    const fine = await next(deliveries);
    assert.equal(fine.data, "fine");
    await fine.ack();
    const again = await next(deliveries); // after its delay
    assert.equal(again.data, "flaky");
    assert.equal(again.deliveryCount, 2);
    await again.nack({ error: "still failing" }); // its second failed delivery: max deliveries
    await consumer.stop();

    info = await jobs.info();
    assert.equal(info.deadLetters, 2n);
    const dead = [];
    for await (const message of client.queue("ts-jobs:dead").browse()) {
      dead.push([message.data, message.headers["busmq-dead-reason"], message.headers["busmq-dead-error"]]);
    }
    assert.deepEqual(dead, [
      ["poison", "rejected", "cannot parse"],
      ["flaky", "max-deliveries", "still failing"],
    ]);
    const requeued = await jobs.requeueDead({ limit: 1 });
    assert.equal(requeued.length, 1);
    const stored = [];
    for await (const message of jobs.browse({ fromId: requeued[0] })) {
      stored.push([message.data, message.headers["busmq-requeued-id"]]);
    }
    assert.deepEqual(stored, [["poison", "1"]]);
    assert.equal((await jobs.info()).deadLetters, 1n);
  });

  test("ordering per key: a key's next message waits for the previous one's ack", async () => {
    const { client } = live();
    const orders = client.queue("ts-ordered");
    await orders.attach();
    await orders.setOrdering("customer");
    await orders.pushBatch(["a0", "a1"], { headers: { customer: "a" } });
    await orders.pushBatch(["b0"], { headers: { customer: "b" } });
    const consumer = orders.consume({ mode: "at-least-once", prefetch: 10 });
    const deliveries = consumer[Symbol.asyncIterator]();
    const a0 = await next(deliveries);
    const b0 = await next(deliveries);
    assert.deepEqual([a0.data, b0.data], ["a0", "b0"]); // a1 waits for a0
    const info = await orders.info();
    assert.equal(info.orderingKey, "customer");
    assert.equal(info.orderedWaiting, 1n);
    await a0.ack();
    const a1 = await next(deliveries);
    assert.equal(a1.data, "a1");
    await Promise.all([a1.ack(), b0.ack()]);
    await consumer.stop();
    await orders.setOrdering(null);
    assert.equal((await orders.info()).orderingKey, "");
  });

  test("schemas: a push that does not fit is refused whole, with where and why", async () => {
    const { client } = live();
    const orders = client.queue("ts-schema");
    await orders.attach();
    const schema = {
      type: "object",
      properties: { id: { type: "string" }, qty: { type: "integer" } },
      required: ["id", "qty"],
    };
    const first = await orders.setSchema(schema);
    assert.equal(first.version, 1);
    await orders.push({ id: "a", qty: 1 });
    await assert.rejects(orders.pushBatch([{ id: "b", qty: 1 }, { id: "c", qty: "2" }]), (error) => {
      assert.ok(error instanceof SchemaError);
      assert.equal(error.version, 1);
      assert.deepEqual(
        error.violations.map((v) => [v.field, v.reason]),
        [["messages[1]/qty", "type"]],
      );
      return true;
    });
    await assert.rejects(orders.setSchema({ ...schema, required: ["id", "qty", "sku"] }), (error) => {
      assert.ok(error instanceof SchemaIncompatibleError);
      assert.deepEqual(error.breaks, ["field `sku` became required"]);
      return true;
    });
    const violations = await orders.checkSchema([{ id: "d" }]);
    assert.deepEqual(violations.map((v) => [v.index, v.rule]), [[0, "required"]]);
    const consumer = orders.consume({ mode: "at-most-once", max: 1 });
    const delivered = await next(consumer[Symbol.asyncIterator]());
    assert.deepEqual([delivered.data, delivered.schemaVersion], [{ id: "a", qty: 1 }, 1]);
    await orders.removeSchema();
    const state = await orders.schema();
    assert.deepEqual([state.current, state.compatibility, state.versions.length], [0, "BACKWARD", 1]);
  });

  test("schemas: a protobuf type refuses a payload that does not parse as it", async () => {
    const { client } = live();
    const typed = client.queue("ts-proto");
    await typed.attach();
    const descriptorSet = toBinary(
      FileDescriptorSetSchema,
      create(FileDescriptorSetSchema, {
        file: [
          {
            name: "order.proto",
            package: "shop",
            syntax: "proto3",
            messageType: [
              {
                name: "Order",
                field: [{ name: "id", number: 1, type: FieldDescriptorProto_Type.STRING, label: FieldDescriptorProto_Label.OPTIONAL }],
              },
            ],
          },
        ],
      }),
    );
    const version = await typed.setProtobufSchema(descriptorSet, "shop.Order");
    assert.deepEqual(version.protobuf, { message: "shop.Order", allowUnknown: false });
    await typed.push(new Uint8Array([0x0a, 0x01, 0x61])); // id = "a"
    await assert.rejects(typed.push(new Uint8Array([0xff, 0xff])), (error) => {
      assert.ok(error instanceof SchemaError);
      assert.deepEqual(error.violations.map((v) => [v.field, v.reason]), [["messages[0]", "protobuf"]]);
      return true;
    });
  });

  test("listQueues pages through the queues of a prefix with their counts", async () => {
    const { client } = live();
    const names = Array.from({ length: 7 }, (_, i) => `ts-listed-${i}`);
    for (const [i, name] of names.entries()) {
      const queue = client.queue(name);
      await queue.attach();
      await queue.pushBatch(Array.from({ length: i + 1 }, (_, n) => n));
    }
    await client.queue("ts-listed-3").pause();
    const listed = [];
    for await (const summary of client.listQueues({ prefix: "ts-listed-", pageSize: 3 })) {
      listed.push(summary);
    }
    assert.deepEqual(listed.map((q) => q.name), names);
    assert.deepEqual(listed.map((q) => q.count), names.map((_, i) => BigInt(i + 1)));
    assert.deepEqual(listed.map((q) => q.paused), names.map((name) => name === "ts-listed-3"));
  });

  test("browse follows new messages until the loop is left", async () => {
    const { client } = live();
    const feed = client.queue("ts-feed");
    await feed.attach();
    await feed.push("first");
    const seen: string[] = [];
    for await (const message of feed.browse({ follow: true })) {
      seen.push(message.data as string);
      if (seen.length === 1) {
        await feed.push("second");
      } else {
        break;
      }
    }
    assert.deepEqual(seen, ["first", "second"]);
  });

  test("a persistable saved by Python is loaded here, and one saved here is loaded by Python", async () => {
    const { client, deployment } = live();
    await python(
      deployment.redisPort,
      `
cart = bus.persistable("ts-cart", {"items": [], "total": 0}, ttl=60)
cart.update({"items": ["book"], "total": 12})
await cart.save()`,
    );
    const cart = client.persistable("ts-cart", { items: [] as string[], total: 0, note: "none" }, { ttlSeconds: 60 });
    assert.equal(await cart.load(), true);
    assert.deepEqual(cart.values, { items: ["book"], total: 12, note: "none" });
    assert.deepEqual(cart.changed, ["note"]); // not stored yet
    cart.set("items", ["book", "pen"]);
    cart.set("total", 15);
    assert.deepEqual(await cart.save(), ["items", "note", "total"]);
    assert.deepEqual(await cart.save(), []); // nothing changed since
    const ttl = await cart.remainingTtl();
    assert.ok(ttl !== undefined && ttl > 50 && ttl <= 60);

    const loaded = JSON.parse(
      await python(
        deployment.redisPort,
        `
cart = bus.persistable("ts-cart", ["items", "total", "note"])
print(json.dumps({"existed": await cart.load(), "values": dict(cart)}))`,
      ),
    );
    assert.deepEqual(loaded, { existed: true, values: { items: ["book", "pen"], total: 15, note: "none" } });

    // Untouched defaults of a new owner do not overwrite what another owner stored.
    const other = client.persistable("ts-cart", { total: 0 });
    await other.save();
    assert.equal(other.get("total"), 15);
    await cart.delete();
    assert.equal(await client.persistable("ts-cart", { total: 0 }).load(), false);
  });
});
