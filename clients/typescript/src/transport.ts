// What the objects (queues, consumers, channels, services, persistables, pushes) need of
// a client: the generated service clients, the deadline, tracing and the push paths, as an
// interface that imports none of them; BusClient (client.ts) implements it and builds the
// objects over it, so the objects never import the client. Also the small helpers they
// share: durations, sleeping, a push's status as its typed error.

import type { MessageInitShape } from "@bufbuild/protobuf";
import { type CallOptions, type Client, ConnectError } from "@connectrpc/connect";
import { toBusError } from "./errors.js";
import type { ChannelService } from "./gen/busmq/v1/channel_service_pb.js";
import type { PersistableService } from "./gen/busmq/v1/persistable_service_pb.js";
import type { PushRequestSchema, QueueService } from "./gen/busmq/v1/queue_service_pb.js";
import type { RequestService } from "./gen/busmq/v1/request_service_pb.js";
import type { Status } from "./gen/google/rpc/status_pb.js";
import type { Tracing } from "./tracing.js";

export type PushInit = MessageInitShape<typeof PushRequestSchema>;

/** A way to store one push: its ids, or its own error. */
export interface Pusher {
  push(request: PushInit): Promise<bigint[]>;
}

export interface Transport {
  readonly queues: Client<typeof QueueService>;
  readonly requests: Client<typeof RequestService>;
  readonly channels: Client<typeof ChannelService>;
  readonly persistables: Client<typeof PersistableService>;
  /** The deadline of a unary call. */
  readonly timeoutMs: number;
  readonly tracing: Tracing | undefined;
  /** Pushes: over the PushStream, else coalesced calls. */
  readonly pushes: Pusher;
  /** The client's PushStream. */
  readonly stream: Pusher;
  /** Run a unary call with the client's deadline, translating its error. */
  unary<T>(call: (options: CallOptions) => Promise<T>, options?: CallOptions): Promise<T>;
  /** Stop `running` when the client closes; call the function returned once it stopped
   * by itself. */
  track(running: Stoppable): () => void;
}

/** Something running on the client's behalf (a channel end's stream, a service's
 * handler) that `close()` stops. */
export interface Stoppable {
  stop(): Promise<void>;
}

/** Rejects a push the gateway cannot take over a stream: it goes by a call instead. */
export const NO_PUSH_STREAM = new Error("the gateway has no PushStream");

/** The typed error of one push's google.rpc.Status (in a PushMany or PushStream reply). */
export function statusError(status: Status | undefined) {
  const details = (status?.details ?? []).map((any) => ({
    type: any.typeUrl.slice(any.typeUrl.lastIndexOf("/") + 1),
    value: any.value,
  }));
  const error = new ConnectError(status?.message ?? "no outcome", status?.code);
  error.details.push(...details); // as connect reads them from a status trailer
  return toBusError(error);
}

export function duration(secondsValue: number): { seconds: bigint; nanos: number } {
  const whole = Math.floor(secondsValue);
  return { seconds: BigInt(whole), nanos: Math.round((secondsValue - whole) * 1e9) };
}

export function seconds(value: { seconds: bigint; nanos: number } | undefined): number {
  return value === undefined ? 0 : Number(value.seconds) + value.nanos / 1e9;
}

/** Resolve after `ms`, or as soon as `signal` aborts (a stopped loop exits at once
 * instead of keeping the process alive through its backoff). */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
