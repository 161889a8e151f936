// Request/reply and channels through a live gateway, with a Python handler on the same bus.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { BusClient, type ChannelEvent, type ChannelMessage, HandlerError } from "../src/index.js";
import { Deployment, liveGateway } from "./support.js";

describe("request/reply and channels through a live gateway", () => {
  const live = liveGateway();

  test("a request to a Python handler gets its reply, and its stream item by item", async () => {
    const { client, deployment } = live();
    await deployment.startPythonHandler("py-math");
    const math = client.service("py-math");
    const reply = (await math.request({ op: "double", n: 21 }, { timeoutMs: 5000 })) as Record<
      string,
      unknown
    >;
    assert.equal(reply.double, 42);
    const items: unknown[] = [];
    for await (const item of math.requestStream({ op: "count", to: 5 })) {
      items.push(item);
    }
    assert.deepEqual(items, [0, 1, 2, 3, 4]);
  });

  test("a TypeScript handler serves values, streams and errors", async () => {
    const { client } = live();
    const echo = client.service("ts-echo");
    const server = echo.serve(async function* handler(request) {
      const data = request.data as { op: string; text?: string };
      if (data.op === "fail") {
        throw new RangeError("no such op");
      }
      if (data.op === "words") {
        for (const word of (data.text ?? "").split(" ")) {
          yield word;
        }
        return;
      }
      yield `echo: ${data.text}`;
    });
    try {
      assert.deepEqual(await echo.request({ op: "say", text: "hi" }), ["echo: hi"]);
      const words: unknown[] = [];
      for await (const word of echo.requestStream({ op: "words", text: "a b c" })) {
        words.push(word);
      }
      assert.deepEqual(words, ["a", "b", "c"]);
      await assert.rejects(echo.request({ op: "fail" }), (error: unknown) => {
        assert.ok(error instanceof HandlerError);
        assert.equal(error.metadata.error_type, "RangeError");
        assert.match(error.message, /no such op/);
        return true;
      });
    } finally {
      await server.stop();
    }
    const unary = client.service("ts-unary");
    const second = unary.serve(async (request) => ({ got: request.data as number }));
    try {
      assert.deepEqual(await unary.request(7), { got: 7 });
    } finally {
      await second.stop();
    }
  });

  test("a channel round trip: connect, send both ways, events, end", async () => {
    const { client } = live();
    const server = client.channel("ts-chat", { local: "server", remote: "client" });
    const user = client.channel("ts-chat", { local: "client", remote: "server" });
    const serverEvents: ChannelEvent[] = [];
    server.on((event) => serverEvents.push(event));
    await server.connect({ mode: "at-least-once" });
    await user.connect();
    assert.equal(server.role, "server");
    assert.equal(user.peerRole, "server");

    await user.send({ text: "hi" });
    for await (const message of server) {
      assert.deepEqual(message.data, { text: "hi" });
      await message.ack();
      await server.send({ echo: message.data });
      break;
    }
    for await (const message of user) {
      assert.deepEqual(message.data, { echo: { text: "hi" } });
      break;
    }
    await user.end();
    const rest = [];
    for await (const message of server) {
      rest.push(message); // the stream ends with the channel
    }
    assert.deepEqual(rest, []);
    const kinds = serverEvents.map((e) => e.kind);
    assert.ok(kinds.includes("remote_connected"), kinds.join());
    assert.equal(kinds.at(-1), "ended");
    assert.equal(serverEvents.at(-1)?.details.by, "remote");
  });

  test("channel ends resume by themselves after a gateway crash: unacked messages come back", async () => {
    const { deployment, client } = live();
    const a = client.channel("ts-resume", { local: "a", remote: "b" });
    const b = client.channel("ts-resume", { local: "b", remote: "a" });
    const events = { a: [] as string[], b: [] as string[] };
    a.on((event) => events.a.push(event.kind));
    b.on((event) => events.b.push(event.kind));
    await a.connect({ mode: "at-least-once", visibilityTimeoutSeconds: 1 });
    await b.connect();
    const inbox = a[Symbol.asyncIterator]();
    await b.send("before the crash");
    const first = (await inbox.next()).value as ChannelMessage;
    assert.equal(first.data, "before the crash"); // not acked

    await deployment.killGateway();
    await deployment.startGateway();
    const connected = (kinds: string[]) => kinds.filter((k) => k === "connected").length;
    for (let waited = 0; connected(events.a) < 2 || connected(events.b) < 2; waited += 20) {
      assert.ok(waited < 20_000, `ends not reconnected: ${JSON.stringify(events)}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.ok(a.resumes >= 1 && b.resumes >= 1);
    assert.ok(events.a.includes("resuming"));
    await b.send("after the restart");
    // At least once: the unacked message comes again (a redelivery may come twice when
    // the visibility timeout passes while it waits in the read-ahead).
    const seen = new Map<string, number>();
    while (seen.size < 2) {
      const message = (await inbox.next()).value as ChannelMessage;
      if (!seen.has(message.data as string)) seen.set(message.data as string, message.deliveryCount);
      await message.ack();
    }
    assert.equal(seen.get("after the restart"), 1);
    assert.ok((seen.get("before the crash") ?? 0) >= 2, JSON.stringify([...seen]));
    await a.end();
    // The resumed peer learns that the channel ended (and stops: it does not resume).
    for (let waited = 0; !events.b.includes("ended"); waited += 20) {
      assert.ok(waited < 20_000, `b not told of the end: ${JSON.stringify(events.b)}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  });
});

describe("closing the client", () => {
  test("stops its channel ends and service handlers, even with the gateway gone", async () => {
    const deployment = await new Deployment().start();
    const client = new BusClient({ url: deployment.url, secret: deployment.secret });
    try {
      const end = client.channel("ts-orphan", { local: "a", remote: "b" });
      await end.connect();
      const server = client.service("ts-orphan-svc").serve(async () => 1);
      await deployment.killGateway(); // both now retry with backoff, against nothing
      await within(5_000, client.close(), "client.close()");
      await within(5_000, server.done, "the handler's end");
      const rest: ChannelMessage[] = [];
      await within(5_000, (async () => {
        for await (const message of end) rest.push(message);
      })(), "the channel end's iteration");
      assert.deepEqual(rest, []);
    } finally {
      await deployment.stop();
    }
  });
});

/** `promise`, or a failure naming `what` if it has not settled within `ms`. */
async function within<T>(ms: number, promise: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not done within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}
