// One end of a channel through the gateway: the ConnectChannel stream is the connected
// end; its deliveries are an async iterable, its state events go to listeners.

import { randomUUID } from "node:crypto";
import { type BusError, streamResumable, toBusError } from "./errors.js";
import type { ConnectChannelResponse } from "./gen/busmq/v1/channel_service_pb.js";
import type { Message } from "./gen/busmq/v1/types_pb.js";
import { decode, encode, type Payload } from "./messages.js";
import { MODES, type Mode } from "./consumer.js";
import { duration, sleep, type Transport } from "./transport.js";

export interface ChannelRoles {
  /** The role this end plays (default "local"). */
  local?: string;
  /** The role of the other end (default "remote"). */
  remote?: string;
}

export interface ConnectOptions {
  /** Play the remote role instead (the roles swapped), as the other end of connect(). */
  listen?: boolean;
  mode?: Mode;
  prefetch?: number;
  visibilityTimeoutSeconds?: number;
  /** How long the channel's queues survive with no end attached. */
  ttlSeconds?: number;
}

/** A state event: "connected", "remote_connected", "remote_disconnected",
 * "disconnected", "ended", "error" or "draining", with its details. */
export interface ChannelEvent {
  kind: string;
  details: Record<string, string>;
}

/** A message received by this end. */
export interface ChannelMessage {
  readonly id: bigint;
  readonly data: Payload;
  readonly headers: Record<string, string>;
  readonly message: Message;
  readonly deliveryCount: number;
  /** At-least-once: acknowledge it (a no-op in the other modes). */
  ack(): Promise<void>;
  /** Run `fn` in a CONSUMER span whose parent is the context the message carries, when
   * the client traces; else just run it. */
  traced<T>(fn: () => Promise<T>): Promise<T>;
}

export class ChannelEnd implements AsyncIterable<ChannelMessage> {
  /** The role this end plays once connected (the remote one after `listen`). */
  role: string | undefined;
  peerRole: string | undefined;
  private connectionId: string | undefined;
  private readonly abort = new AbortController();
  private readonly inbox: ChannelMessage[] = [];
  private waiting: (() => void) | undefined;
  private finished = false;
  private failure: unknown;
  private readonly listeners = new Set<(event: ChannelEvent) => void>();
  private options: ConnectOptions = {};
  private closing = false;
  private pumping: Promise<void> = Promise.resolve();
  /** How many times the stream was reopened after breaking. */
  resumes = 0;
  /** The last error that broke the stream (it was resumed). */
  lastError: BusError | undefined;

  constructor(
    readonly client: Transport,
    readonly name: string,
    readonly roles: ChannelRoles = {},
  ) {}

  /** Call `listener` with each state event. */
  on(listener: (event: ChannelEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Connect this end; resolves once the gateway has connected it. From then on the end
   * resumes by itself when its stream breaks (a gateway restart, a cut, a draining
   * gateway): it reconnects with backoff, emits `{ kind: "resuming" }` first, and keeps
   * delivering; at-least-once deliveries not acked before the break come back. */
  async connect(options: ConnectOptions = {}): Promise<void> {
    this.options = options;
    const first = await this.open();
    const untrack = this.client.track(this); // the client's close() stops it
    this.pumping = this.pump(first).finally(untrack);
  }

  private async open(): Promise<AsyncIterator<ConnectChannelResponse>> {
    const options = this.options;
    const stream = this.client.channels.connectChannel(
      {
        channel: this.name,
        localRole: this.roles.local ?? "",
        remoteRole: this.roles.remote ?? "",
        listen: options.listen ?? false,
        mode: MODES[this.mode],
        prefetch: options.prefetch ?? 0,
        visibilityTimeout:
          options.visibilityTimeoutSeconds === undefined
            ? undefined
            : duration(options.visibilityTimeoutSeconds),
        ttl: options.ttlSeconds === undefined ? undefined : duration(options.ttlSeconds),
      },
      { signal: this.abort.signal },
    );
    const iterator = stream[Symbol.asyncIterator]();
    let first: Awaited<ReturnType<typeof iterator.next>>;
    try {
      first = await iterator.next();
    } catch (error) {
      throw toBusError(error);
    }
    if (first.done || first.value.event.case !== "started") {
      throw new TypeError("the channel stream did not start");
    }
    const started = first.value.event.value;
    this.connectionId = started.connectionId;
    this.role = started.role;
    this.peerRole = started.peerRole;
    return iterator;
  }

  private get mode(): Mode {
    return this.options.mode ?? "at-most-once";
  }

  private async pump(first: AsyncIterator<ConnectChannelResponse>): Promise<void> {
    let iterator: AsyncIterator<ConnectChannelResponse> | undefined = first;
    let backoff = 100;
    try {
      while (!this.abort.signal.aborted) {
        let ended = false;
        try {
          iterator ??= await this.open();
          backoff = 100;
          for (let next = await iterator.next(); !next.done; next = await iterator.next()) {
            const event = next.value.event;
            if (event.case === "delivery" && event.value.message !== undefined) {
              this.deliver(event.value.message, event.value.deliveryCount);
            } else if (event.case === "state") {
              ended ||= event.value.kind === "ended";
              this.emit({ kind: event.value.kind, details: { ...event.value.details } });
            }
          }
        } catch (error) {
          if (this.abort.signal.aborted) {
            return;
          }
          const busError = toBusError(error);
          if (!streamResumable(busError)) {
            this.failure = busError;
            return;
          }
          this.lastError = busError;
        }
        if (ended || this.closing || this.abort.signal.aborted) {
          return;
        }
        // Broken, or ended by a draining gateway: reconnect after a pause.
        iterator = undefined;
        this.resumes += 1;
        this.emit({ kind: "resuming", details: { error: this.lastError?.message ?? "stream ended" } });
        await sleep(backoff * (0.5 + Math.random()), this.abort.signal);
        backoff = Math.min(backoff * 2, 5000);
      }
    } finally {
      this.finished = true;
      this.waiting?.();
    }
  }

  private emit(event: ChannelEvent): void {
    this.listeners.forEach((listener) => listener(event));
  }

  private deliver(message: Message, deliveryCount: number): void {
    const role = this.role ?? "";
    const mode = this.mode;
    const ack = async (): Promise<void> => {
      if (mode !== "at-least-once") {
        return;
      }
      await this.client.unary((o) =>
        this.client.channels.ackChannel({ channel: this.name, role, ids: [message.id] }, o),
      );
    };
    const headers = { ...message.headers };
    const tracing = this.client.tracing;
    this.inbox.push({
      id: message.id,
      data: decode(message),
      headers,
      message,
      deliveryCount,
      ack,
      traced: (fn) => (tracing === undefined ? fn() : tracing.process(this.name, headers, message.id, fn)),
    });
    this.waiting?.();
  }

  async *[Symbol.asyncIterator](): AsyncIterator<ChannelMessage> {
    for (;;) {
      const next = this.inbox.shift();
      if (next !== undefined) {
        yield next;
        continue;
      }
      if (this.finished) {
        if (this.failure !== undefined) {
          throw this.failure;
        }
        return;
      }
      await new Promise<void>((resolve) => {
        this.waiting = resolve;
      });
      this.waiting = undefined;
    }
  }

  /** Send to the peer; returns the id in the peer's queue. When the client traces, in a
   * PRODUCER span `send <channel>` whose context the message carries. */
  async send(payload: Payload, options: { headers?: Record<string, string> } = {}): Promise<bigint> {
    const requestId = randomUUID();
    const sendWith = async (headers: Record<string, string> | undefined): Promise<bigint> => {
      const reply = await this.client.unary((o) =>
        this.client.channels.sendChannel(
          { connectionId: this.requireConnection(), messages: [encode(payload, headers)], requestId },
          o,
        ),
      );
      return reply.ids[0] as bigint;
    };
    const tracing = this.client.tracing;
    if (tracing === undefined) {
      return sendWith(options.headers);
    }
    return tracing.send(this.name, 1, (carrier) => sendWith({ ...carrier, ...options.headers }));
  }

  /** Disconnect this end (messages keep waiting in its queue for the next connect). */
  async disconnect(): Promise<void> {
    this.closing = true;
    await this.client.unary((o) =>
      this.client.channels.disconnectChannel({ connectionId: this.requireConnection() }, o),
    );
  }

  /** End the channel for both ends and remove its queues. */
  async end(): Promise<void> {
    this.closing = true;
    await this.client.unary((o) =>
      this.client.channels.endChannel({ connectionId: this.requireConnection() }, o),
    );
  }

  /** Stop the stream without telling the gateway anything more. */
  close(): void {
    this.abort.abort();
  }

  /** `close()`, and wait until the stream has stopped. */
  async stop(): Promise<void> {
    this.close();
    await this.pumping;
  }

  private requireConnection(): string {
    if (this.connectionId === undefined) {
      throw new TypeError(`channel ${this.name}: connect() first`);
    }
    return this.connectionId;
  }
}
