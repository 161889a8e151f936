// The client's TLS options against a gateway that serves TLS and requires client certificates.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { BusClient, BusError } from "../src/index.js";
import { Deployment } from "./support.js";

describe("TLS and client certificates", () => {
  let deployment: Deployment;
  before(async () => {
    deployment = await new Deployment().withMutualTls().start();
  });
  after(async () => {
    await deployment?.stop();
  });

  test("with the CA and a client certificate, calls and streams work over TLS", async () => {
    const pki = deployment.pki!;
    const client = new BusClient({
      url: deployment.url,
      secret: deployment.secret,
      ca: pki.ca,
      cert: pki.clientCert,
      key: pki.clientKey,
    });
    try {
      assert.ok(client.url.startsWith("https://"));
      const queue = client.queue("ts-tls");
      await queue.attach();
      await queue.pushBatch(["over", "tls"]);
      const read: unknown[] = [];
      for await (const delivery of queue.consume({ mode: "at-least-once", max: 2 })) {
        read.push(delivery.data);
        await delivery.ack();
      }
      assert.deepEqual(read, ["over", "tls"]);
      await queue.destroy();
    } finally {
      await client.close();
    }
  });

  test("without a client certificate the handshake is refused, as a transport error", async () => {
    const client = new BusClient({ url: deployment.url, secret: deployment.secret, ca: deployment.pki!.ca, timeoutMs: 3000 });
    await assert.rejects(client.queue("ts-tls").attach(), (error: unknown) => {
      assert.ok(error instanceof BusError, String(error));
      assert.ok(error.fromTransport, `${error.reason}: ${error.message}`);
      return true;
    });
  });

  test("a gateway certificate from a CA the client does not trust is refused", async () => {
    const pki = deployment.pki!;
    // No `ca`: the system roots, which did not sign the throwaway CA.
    const client = new BusClient({ url: deployment.url, secret: deployment.secret, cert: pki.clientCert, key: pki.clientKey, timeoutMs: 3000 });
    await assert.rejects(client.queue("ts-tls").attach(), (error: unknown) => {
      assert.ok(error instanceof BusError, String(error));
      assert.ok(error.fromTransport, `${error.reason}: ${error.message}`);
      assert.match(error.message, /certificate/i);
      return true;
    });
  });

  test("TLS files with an http:// URL are a configuration error", () => {
    assert.throws(() => new BusClient({ url: "http://127.0.0.1:1", ca: deployment.pki!.ca }), /https:\/\//);
  });
});
