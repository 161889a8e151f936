// Payloads as the bus carries them: bytes, text or JSON, with string headers.

import type { MessageInitShape } from "@bufbuild/protobuf";
import {
  type Message,
  type OutgoingMessageSchema,
  PayloadKind,
} from "./gen/busmq/v1/types_pb.js";

/** What a push takes: bytes, text, or any JSON value. */
export type Payload = Uint8Array | string | JsonValue;
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** The wire form of one outgoing message. */
export function encode(
  payload: Payload,
  headers: Record<string, string> = {},
): MessageInitShape<typeof OutgoingMessageSchema> {
  if (payload instanceof Uint8Array) {
    return { payload, kind: PayloadKind.BYTES, headers };
  }
  if (typeof payload === "string") {
    return { payload: encoder.encode(payload), kind: PayloadKind.TEXT, headers };
  }
  return { payload: encoder.encode(JSON.stringify(payload)), kind: PayloadKind.JSON, headers };
}

/** The wire form of a reply (a payload without headers). */
export function encodeValue(payload: Payload): { payload: Uint8Array; kind: PayloadKind } {
  const { payload: bytes, kind } = encode(payload);
  return { payload: bytes as Uint8Array, kind: kind as PayloadKind };
}

/** A payload as it was pushed: bytes, text or the parsed JSON value. */
export function decode(message: Pick<Message, "payload" | "kind">): Payload {
  switch (message.kind) {
    case PayloadKind.TEXT:
      return decoder.decode(message.payload);
    case PayloadKind.JSON:
      return JSON.parse(decoder.decode(message.payload)) as JsonValue;
    default:
      return message.payload;
  }
}
