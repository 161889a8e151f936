// Trace propagation: a traced push's context travels in the message's W3C headers and a
// handling span is its child; a request from TypeScript to a Python handler is one trace.

import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from "@opentelemetry/sdk-trace-base";
import { BusClient } from "../src/index.js";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { CHILD_MS, liveGateway, PYTHON, ROOT } from "./support.js";

context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const app = provider.getTracer("app");

function only(name: string): ReadableSpan {
  const spans = exporter.getFinishedSpans().filter((span) => span.name === name);
  assert.equal(spans.length, 1, `one span ${name}, got ${spans.length}`);
  return spans[0] as ReadableSpan;
}

function parentId(span: ReadableSpan): string | undefined {
  return span.parentSpanContext?.spanId;
}

describe("tracing through a live gateway", () => {
  const live = liveGateway();
  const traced = () => {
    const { deployment } = live();
    return new BusClient({ url: deployment.url, secret: deployment.secret, tracing: { tracerProvider: provider } });
  };

  test("a handled message is a child of its push, in the same trace", async () => {
    const client = traced();
    try {
      const queue = client.queue("ts-traced");
      await queue.attach();
      const checkout = await app.startActiveSpan("checkout", async (span) => {
        await queue.push({ order: 1 }, { headers: { tenant: "a" } });
        span.end();
        return span;
      });
      const consumer = queue.consume({ mode: "at-least-once" });
      for await (const delivery of consumer) {
        assert.equal(delivery.headers.tenant, "a");
        assert.match(delivery.headers.traceparent ?? "", /^00-[0-9a-f]{32}-[0-9a-f]{16}-01$/);
        await delivery.traced(async () => {
          assert.equal(trace.getActiveSpan()?.spanContext().traceId, checkout.spanContext().traceId);
        });
        await delivery.ack();
        break;
      }
      await consumer.stop();
      const send = only("send ts-traced");
      const process = only("process ts-traced");
      assert.equal(parentId(send), checkout.spanContext().spanId);
      assert.equal(parentId(process), send.spanContext().spanId);
      assert.equal(send.attributes["messaging.system"], "busmq");
      assert.equal(process.attributes["messaging.operation.type"], "process");
    } finally {
      await client.close();
    }
  });

  test("a request to a Python handler is one trace: its span is a child of the requester's", async () => {
    const { deployment } = live();
    await deployment.startPythonHandler("py-traced", true);
    const client = traced();
    try {
      const service = client.service("py-traced");
      const [quote, reply] = await app.startActiveSpan("quote", async (span) => {
        const answer = (await service.request({ op: "trace" }, { timeoutMs: 10_000 })) as Record<string, string>;
        span.end();
        return [span, answer] as const;
      });
      assert.equal(reply.trace_id, quote.spanContext().traceId);
      assert.equal(reply.parent_id, quote.spanContext().spanId);
      assert.notEqual(reply.span_id, quote.spanContext().spanId);
    } finally {
      await client.close();
    }
  });

  test("one trace across datacenters and a cut link: Python producer, its outbox, the gateway, this consumer", async () => {
    const { deployment } = live();
    const client = traced();
    try {
      const queue = client.queue("shipments-ts");
      await queue.attach();
      // "Another datacenter": a traced Python bus federating this queue pushes while its
      // link is cut (the push waits in its outbox), then the link is restored.
      const { stdout } = await promisify(execFile)(
        PYTHON,
        ["-m", "tests.support.traced_federated_push", `127.0.0.1:${deployment.gatewayPort}`, deployment.secret, "shipments-ts"],
        { cwd: ROOT, timeout: CHILD_MS },
      );
      const pushed = JSON.parse(stdout) as { trace_id: string; send_span_ids: Record<string, string>; outbox_held: number };
      assert.equal(pushed.outbox_held, 1);
      const consumer = queue.consume({ mode: "at-least-once" });
      for await (const delivery of consumer) {
        await delivery.traced(async () => delivery.ack());
        break;
      }
      await consumer.stop();
      const process = only("process shipments-ts");
      assert.equal(process.spanContext().traceId, pushed.trace_id);
      assert.equal(parentId(process), pushed.send_span_ids["shipments-ts"]);
      assert.equal(process.parentSpanContext?.isRemote, true);
    } finally {
      await client.close();
    }
  });

  test("a channel message is handled in a child of its send's span", async () => {
    const client = traced();
    try {
      const a = client.channel("ts-traced-chat", { local: "a", remote: "b" });
      const b = client.channel("ts-traced-chat", { local: "b", remote: "a" });
      await a.connect();
      await b.connect();
      const talk = await app.startActiveSpan("talk", async (span) => {
        await a.send("hello", { headers: { tenant: "t" } });
        span.end();
        return span;
      });
      for await (const message of b) {
        assert.equal(message.headers.tenant, "t");
        await message.traced(async () => undefined);
        break;
      }
      await a.end();
      const send = only("send ts-traced-chat");
      const process = only("process ts-traced-chat");
      assert.equal(parentId(send), talk.spanContext().spanId);
      assert.equal(parentId(process), send.spanContext().spanId);
    } finally {
      await client.close();
    }
  });
});
