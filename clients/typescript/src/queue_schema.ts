// A queue's schema through the gateway's QueueService (SetQueueSchema, GetQueueSchema,
// RemoveQueueSchema, CheckQueueSchema), as plain functions the queue handle calls.

import { SchemaCompatibility } from "./gen/busmq/v1/queue_service_pb.js";
import type { SchemaVersion as WireVersion } from "./gen/busmq/v1/queue_service_pb.js";
import { encode, type Payload } from "./messages.js";
import type { Transport } from "./transport.js";

/** How a new version must relate to the earlier ones (Confluent's modes). */
export type Compatibility =
  | "BACKWARD"
  | "BACKWARD_TRANSITIVE"
  | "FORWARD"
  | "FORWARD_TRANSITIVE"
  | "FULL"
  | "FULL_TRANSITIVE"
  | "NONE";

/** One version of a queue's schema. */
export interface SchemaVersion {
  version: number;
  /** The JSON Schema document (undefined for a protobuf type). */
  schema: unknown;
  /** The protobuf message type (undefined for a JSON Schema). */
  protobuf?: { message: string; allowUnknown: boolean };
  createdMs: number;
}

/** A queue's schema: the version enforced (0: none), the mode, every version. */
export interface QueueSchema {
  current: number;
  compatibility: Compatibility;
  versions: SchemaVersion[];
}

/** Why a message does not fit: its index, the JSON pointer, the keyword broken. */
export interface SchemaViolation {
  index: number;
  pointer: string;
  rule: string;
  message: string;
}

function fromWire(version: WireVersion): SchemaVersion {
  const created = version.createTime;
  const protobuf = version.protobuf;
  return {
    version: version.version,
    schema: protobuf ? undefined : JSON.parse(version.jsonSchema),
    protobuf: protobuf ? { message: protobuf.message, allowUnknown: protobuf.allowUnknown } : undefined,
    createdMs: created ? Number(created.seconds) * 1000 + Math.floor(created.nanos / 1e6) : 0,
  };
}

export async function setSchema(
  client: Transport,
  queue: string,
  schema: unknown,
  compatibility?: Compatibility,
): Promise<SchemaVersion> {
  const reply = await client.unary((o) =>
    client.queues.setQueueSchema(
      {
        queue,
        jsonSchema: JSON.stringify(schema),
        compatibility: compatibility ? SchemaCompatibility[compatibility] : SchemaCompatibility.UNSPECIFIED,
      },
      o,
    ),
  );
  if (!reply.version) {
    throw new Error("SetQueueSchema answered without a version");
  }
  return fromWire(reply.version);
}

/** A protobuf message type as the queue's schema: a serialized FileDescriptorSet and
 * the message's full name; unknown fields refused unless `allowUnknown`. */
export async function setProtobufSchema(
  client: Transport,
  queue: string,
  descriptorSet: Uint8Array,
  message: string,
  options: { allowUnknown?: boolean; compatibility?: Compatibility } = {},
): Promise<SchemaVersion> {
  const reply = await client.unary((o) =>
    client.queues.setQueueSchema(
      {
        queue,
        protobuf: { descriptorSet, message, allowUnknown: options.allowUnknown ?? false },
        compatibility: options.compatibility
          ? SchemaCompatibility[options.compatibility]
          : SchemaCompatibility.UNSPECIFIED,
      },
      o,
    ),
  );
  if (!reply.version) {
    throw new Error("SetQueueSchema answered without a version");
  }
  return fromWire(reply.version);
}

export async function getSchema(client: Transport, queue: string): Promise<QueueSchema> {
  const reply = await client.unary((o) => client.queues.getQueueSchema({ queue }, o));
  return {
    current: reply.currentVersion,
    compatibility: (SchemaCompatibility[reply.compatibility] ?? "BACKWARD") as Compatibility,
    versions: reply.versions.map(fromWire),
  };
}

export async function removeSchema(client: Transport, queue: string): Promise<void> {
  await client.unary((o) => client.queues.removeQueueSchema({ queue }, o));
}

export async function checkSchema(
  client: Transport,
  queue: string,
  values: Payload[],
): Promise<SchemaViolation[]> {
  const messages = values.map((value) => encode(value, {}));
  const reply = await client.unary((o) => client.queues.checkQueueSchema({ queue, messages }, o));
  return reply.violations.map((v) => ({ index: v.index, pointer: v.pointer, rule: v.rule, message: v.message }));
}
