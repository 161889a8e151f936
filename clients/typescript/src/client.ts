// The connection to one gateway: transport (h2c or TLS/mTLS), the bearer secret on every
// call, a deadline on every unary call, and typed errors. Queues hang off it.

import { isIP } from "node:net";
import { type CallOptions, type Client, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { toBusError } from "./errors.js";
import { ChannelEnd, type ChannelRoles } from "./channel.js";
import { ChannelService } from "./gen/busmq/v1/channel_service_pb.js";
import { PersistableService } from "./gen/busmq/v1/persistable_service_pb.js";
import { QueueService } from "./gen/busmq/v1/queue_service_pb.js";
import { RequestService } from "./gen/busmq/v1/request_service_pb.js";
import { PushStreamer } from "./push_stream.js";
import { PushCoalescer } from "./pushes.js";
import type { JsonValue } from "./messages.js";
import { Persistable, type PersistableOptions } from "./persistable.js";
import { QueueHandle } from "./queue.js";
import { listQueues, type ListQueuesOptions, type QueueSummary } from "./queue_admin.js";
import { ServiceHandle } from "./service.js";
import { Tracing, type TracingOptions } from "./tracing.js";
import { retrySafeCalls } from "./retry.js";
import type { Stoppable, Transport } from "./transport.js";

export interface BusClientOptions {
  /** The gateway: "https://gateway-a:8443" (TLS) or "http://127.0.0.1:8443" (plaintext). */
  url: string;
  /** The gateway's shared secret, sent as `authorization: Bearer <secret>`. */
  secret?: string;
  /** PEM of the CA that signed the gateway's certificate (default: the system roots). */
  ca?: string | Buffer;
  /** PEM client certificate and key, for a gateway that requires them (mTLS). */
  cert?: string | Buffer;
  key?: string | Buffer;
  /** Deadline of every unary call, in milliseconds (default 10,000). */
  timeoutMs?: number;
  /** Accept "http://" to a host that is not loopback: the secret then crosses the
   * network in cleartext, so only behind a TLS-terminating proxy or mesh. */
  allowPlaintext?: boolean;
  /** OpenTelemetry propagation: pushes and requests carry the trace context in W3C
   * headers, in PRODUCER spans; service handlers and `delivery.traced()` run in
   * CONSUMER spans under it (`true`: the global tracer provider). */
  tracing?: boolean | TracingOptions;
}

/** A client of one busmq gateway. Close it to release its attachments. */
export class BusClient implements Transport {
  readonly url: string;
  readonly timeoutMs: number;
  /** The generated service clients, for calls the helpers do not cover. */
  readonly queues: Client<typeof QueueService>;
  readonly requests: Client<typeof RequestService>;
  readonly channels: Client<typeof ChannelService>;
  readonly persistables: Client<typeof PersistableService>;
  /** Pushes go over `stream`; without it, pushes made while a push call is under way go
   * together in the next one. */
  readonly pushes: PushCoalescer;
  /** The client's PushStream. */
  readonly stream: PushStreamer;
  /** Trace propagation, when the `tracing` option is on. */
  readonly tracing: Tracing | undefined;
  private readonly handles = new Set<QueueHandle>();
  private readonly running = new Set<Stoppable>();

  constructor(options: BusClientOptions) {
    const url = new URL(options.url);
    if (url.protocol !== "https:" && url.protocol !== "http:") {
      throw new TypeError(`gateway URL ${options.url}: use https://host:port or http://host:port`);
    }
    if (url.protocol === "http:" && !isLoopback(url.hostname) && !options.allowPlaintext) {
      throw new TypeError(
        `${options.url}: refusing plaintext to a host that is not loopback (the secret would ` +
          "cross the network in cleartext); use https://, or allowPlaintext if a " +
          "TLS-terminating proxy encrypts the hop",
      );
    }
    if (url.protocol === "http:" && (options.ca || options.cert || options.key)) {
      throw new TypeError(`${options.url}: TLS files need an https:// URL`);
    }
    this.url = url.origin;
    this.timeoutMs = options.timeoutMs ?? 10_000;
    const interceptors: Interceptor[] = [retrySafeCalls()];
    if (options.secret !== undefined) {
      const authorization = `Bearer ${options.secret}`;
      interceptors.push((next) => (request) => {
        request.header.set("authorization", authorization);
        return next(request);
      });
    }
    const transport = createGrpcTransport({
      baseUrl: this.url,
      interceptors,
      nodeOptions: { ca: options.ca, cert: options.cert, key: options.key },
    });
    this.queues = createClient(QueueService, transport);
    this.requests = createClient(RequestService, transport);
    this.channels = createClient(ChannelService, transport);
    this.persistables = createClient(PersistableService, transport);
    this.pushes = new PushCoalescer(this);
    this.stream = new PushStreamer(this);
    const tracing = options.tracing;
    this.tracing = tracing ? new Tracing(tracing === true ? {} : tracing) : undefined;
  }

  /** A handle on queue `name` (attach it to create it). */
  queue(name: string): QueueHandle {
    const handle = new QueueHandle(this, name);
    this.handles.add(handle);
    return handle;
  }

  /** Request/reply service `name`: `request()`, `requestStream()`, `serve()`. */
  service(name: string): ServiceHandle {
    return new ServiceHandle(this, name);
  }

  /** One end of channel `name`, playing `local` towards `remote` (defaults "local" and
   * "remote"); `connect()` it. */
  channel(name: string, roles: ChannelRoles = {}): ChannelEnd {
    return new ChannelEnd(this, name, roles);
  }

  /** Persistable `name` tracking `fields` (names to defaults); `load()` and `save()` it. */
  persistable<T extends Record<string, JsonValue>>(
    name: string,
    fields: T,
    options: PersistableOptions = {},
  ): Persistable<T> {
    return new Persistable(this, name, fields, options);
  }

  /** The queues this principal may see, page by page from the gateway (name order). */
  listQueues(options: ListQueuesOptions = {}): AsyncIterable<QueueSummary> {
    return listQueues(this, options);
  }

  /** Run a unary call with the client's deadline, translating its error. */
  async unary<T>(call: (options: CallOptions) => Promise<T>, options: CallOptions = {}): Promise<T> {
    try {
      return await call({ timeoutMs: this.timeoutMs, ...options });
    } catch (error) {
      throw toBusError(error);
    }
  }

  track(running: Stoppable): () => void {
    this.running.add(running);
    return () => this.running.delete(running);
  }

  /** Stop every consumer, channel end and service handler, and release every attachment
   * made through this client. */
  async close(): Promise<void> {
    const handles = [...this.handles];
    const running = [...this.running];
    this.handles.clear();
    this.running.clear();
    await Promise.allSettled([...handles.map((h) => h.close()), ...running.map((r) => r.stop())]);
    this.stream.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

function isLoopback(host: string): boolean {
  const bare = host.replace(/^\[|\]$/g, "");
  if (bare === "localhost") {
    return true;
  }
  if (isIP(bare) === 4) {
    return bare.startsWith("127.");
  }
  return bare === "::1";
}
