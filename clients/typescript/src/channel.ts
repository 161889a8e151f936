// One end of a channel through the gateway: the ConnectChannel stream is the connected
// end; its deliveries are an async iterable, its state events go to listeners.

import { randomUUID } from "node:crypto";
import type { BusClient } from "./client.js";
import { toBusError } from "./errors.js";
import type { ConnectChannelResponse } from "./gen/busmq/v1/channel_service_pb.js";
import type { Message } from "./gen/busmq/v1/types_pb.js";
import { decode, encode, type Payload } from "./messages.js";
import { MODES, type Mode } from "./consumer.js";
import { duration } from "./queue.js";

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

  constructor(
    readonly client: BusClient,
    readonly name: string,
    readonly roles: ChannelRoles = {},
  ) {}

  /** Call `listener` with each state event. */
  on(listener: (event: ChannelEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Connect this end; resolves once the gateway has connected it. */
  async connect(options: ConnectOptions = {}): Promise<void> {
    const mode = options.mode ?? "at-most-once";
    const stream = this.client.channels.connectChannel(
      {
        channel: this.name,
        localRole: this.roles.local ?? "",
        remoteRole: this.roles.remote ?? "",
        listen: options.listen ?? false,
        mode: MODES[mode],
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
    void this.pump(iterator, mode);
  }

  private async pump(iterator: AsyncIterator<ConnectChannelResponse>, mode: Mode): Promise<void> {
    try {
      for (let next = await iterator.next(); !next.done; next = await iterator.next()) {
        const event = next.value.event;
        if (event.case === "delivery" && event.value.message !== undefined) {
          this.deliver(event.value.message, event.value.deliveryCount, mode);
        } else if (event.case === "state") {
          const state = { kind: event.value.kind, details: { ...event.value.details } };
          this.listeners.forEach((listener) => listener(state));
        }
      }
    } catch (error) {
      if (!this.abort.signal.aborted) {
        this.failure = toBusError(error);
      }
    } finally {
      this.finished = true;
      this.waiting?.();
    }
  }

  private deliver(message: Message, deliveryCount: number, mode: Mode): void {
    const role = this.role ?? "";
    const ack = async (): Promise<void> => {
      if (mode !== "at-least-once") {
        return;
      }
      await this.client.unary((o) =>
        this.client.channels.ackChannel({ channel: this.name, role, ids: [message.id] }, o),
      );
    };
    this.inbox.push({
      id: message.id,
      data: decode(message),
      headers: { ...message.headers },
      message,
      deliveryCount,
      ack,
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

  /** Send to the peer; returns the id in the peer's queue. */
  async send(payload: Payload, options: { headers?: Record<string, string> } = {}): Promise<bigint> {
    const reply = await this.client.unary((o) =>
      this.client.channels.sendChannel(
        {
          connectionId: this.requireConnection(),
          messages: [encode(payload, options.headers)],
          requestId: randomUUID(),
        },
        o,
      ),
    );
    return reply.ids[0] as bigint;
  }

  /** Disconnect this end (messages keep waiting in its queue for the next connect). */
  async disconnect(): Promise<void> {
    await this.client.unary((o) =>
      this.client.channels.disconnectChannel({ connectionId: this.requireConnection() }, o),
    );
  }

  /** End the channel for both ends and remove its queues. */
  async end(): Promise<void> {
    await this.client.unary((o) =>
      this.client.channels.endChannel({ connectionId: this.requireConnection() }, o),
    );
  }

  /** Stop the stream without telling the gateway anything more. */
  close(): void {
    this.abort.abort();
  }

  private requireConnection(): string {
    if (this.connectionId === undefined) {
      throw new TypeError(`channel ${this.name}: connect() first`);
    }
    return this.connectionId;
  }
}
