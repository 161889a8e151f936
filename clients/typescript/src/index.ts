// busmq's TypeScript client: a thin layer over the code generated from proto/.

export {
  type ChannelEvent,
  ChannelEnd,
  type ChannelMessage,
  type ChannelRoles,
  type ConnectOptions,
} from "./channel.js";
export { BusClient, type BusClientOptions } from "./client.js";
export { Consumer, type ConsumeOptions, Delivery, type Mode } from "./consumer.js";
export * from "./errors.js";
export type { JsonValue, Payload } from "./messages.js";
export { Persistable, type PersistableOptions } from "./persistable.js";
export { type AttachOptions, type PushOptions, QueueHandle, type QueueInfo } from "./queue.js";
export {
  type BrowseOptions,
  type ListQueuesOptions,
  type QueueSummary,
  type RateLimit,
  type StoredMessage,
} from "./queue_admin.js";
export {
  type Handler,
  type RequestOptions,
  type ServedRequest,
  Server,
  type ServeOptions,
  ServiceHandle,
} from "./service.js";
export type { Compatibility, QueueSchema, SchemaVersion, SchemaViolation } from "./queue_schema.js";
export { Tracing, type TracingOptions } from "./tracing.js";
