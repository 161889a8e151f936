// A persistable object through the gateway: tracked JSON fields saved to and loaded from
// the bus, with an expiry kept alive while its owner runs. The same objects the Python
// `bus.persistable()` and the gateway's PersistableService read and write.

import type { JsonValue } from "./messages.js";
import { duration, seconds, type Transport } from "./transport.js";

export interface PersistableOptions {
  /** Seconds the object survives its last save or renewal (default: the gateway's). */
  ttlSeconds?: number;
}

/** Persistable `name` with its tracked fields (names to defaults): read and set them with
 * `get()`/`set()` (or `values`), then `save()`; `load()` reads what is stored. */
export class Persistable<T extends Record<string, JsonValue>> {
  private readonly current: Record<string, JsonValue>;
  private readonly defaults: Record<string, string>;
  /** The JSON text of each field as last saved or loaded by this owner. */
  private saved = new Map<string, string>();
  private renewal: NodeJS.Timeout | undefined;

  constructor(
    readonly client: Transport,
    readonly name: string,
    fields: T,
    readonly options: PersistableOptions = {},
  ) {
    if (Object.keys(fields).length === 0) {
      throw new TypeError("a persistable tracks at least one field");
    }
    this.defaults = Object.fromEntries(Object.entries(fields).map(([k, v]) => [k, JSON.stringify(v)]));
    this.current = JSON.parse(JSON.stringify(fields)) as Record<string, JsonValue>;
  }

  /** The local values (a copy). */
  get values(): T {
    return JSON.parse(JSON.stringify(this.current)) as T;
  }

  get<K extends keyof T & string>(field: K): T[K] {
    return this.current[field] as T[K];
  }

  set<K extends keyof T & string>(field: K, value: T[K]): void {
    if (!(field in this.current)) {
      throw new TypeError(`${field} is not a tracked field of ${this.name}`);
    }
    this.current[field] = JSON.parse(JSON.stringify(value)) as JsonValue;
  }

  /** The fields that differ from what this owner last saved or loaded. */
  get changed(): string[] {
    return Object.keys(this.changes()).sort();
  }

  private changes(): Record<string, string> {
    const out: Record<string, string> = {};
    for (const [field, value] of Object.entries(this.current)) {
      const text = JSON.stringify(value);
      if (this.saved.get(field) !== text) {
        out[field] = text;
      }
    }
    return out;
  }

  /** Write the changed fields and refresh the expiry in one call; returns the fields
   * written. A field this owner never loaded or saved that still holds its default is
   * written only where the stored object lacks it (another owner's value is kept, and
   * becomes the local one). */
  async save(): Promise<string[]> {
    const changes = this.changes();
    const written = Object.keys(changes).sort();
    if (written.length === 0) {
      return [];
    }
    const defaults: Record<string, string> = {};
    const fields: Record<string, string> = {};
    for (const [field, text] of Object.entries(changes)) {
      if (!this.saved.has(field) && text === this.defaults[field]) {
        defaults[field] = text;
      } else {
        fields[field] = text;
      }
    }
    const reply = await this.client.unary((o) =>
      this.client.persistables.savePersistable(
        { name: this.name, fields, defaults, ttl: this.ttl() },
        o,
      ),
    );
    for (const [field, text] of Object.entries(fields)) {
      this.saved.set(field, text);
    }
    for (const [field, text] of Object.entries(reply.defaults)) {
      this.current[field] = JSON.parse(text) as JsonValue;
      this.saved.set(field, text);
    }
    return written;
  }

  /** Read every tracked field; returns whether the object exists. Stored fields replace
   * the local values; the others keep theirs and count as changed. */
  async load(): Promise<boolean> {
    const reply = await this.client.unary((o) =>
      this.client.persistables.loadPersistable({ name: this.name, fields: Object.keys(this.current) }, o),
    );
    const loaded: Record<string, JsonValue> = {};
    for (const [field, text] of Object.entries(reply.fields)) {
      if (field in this.current) {
        loaded[field] = JSON.parse(text) as JsonValue;
      }
    }
    Object.assign(this.current, loaded);
    this.saved = new Map(Object.entries(loaded).map(([f, v]) => [f, JSON.stringify(v)]));
    return reply.exists;
  }

  /** Seconds until the object expires, or undefined if it is not stored. */
  async remainingTtl(): Promise<number | undefined> {
    const reply = await this.client.unary((o) =>
      this.client.persistables.loadPersistable({ name: this.name, fields: Object.keys(this.current) }, o),
    );
    return reply.exists ? seconds(reply.ttl) : undefined;
  }

  /** Set the expiry to the ttl from now without writing fields (a missing object is not
   * created). */
  async touch(): Promise<void> {
    await this.client.unary((o) =>
      this.client.persistables.renewPersistable({ name: this.name, ttl: this.ttl() }, o),
    );
  }

  /** Keep the object alive while this owner runs: `touch()` every third of the ttl
   * until `unpersist()` (a failed renewal is retried at the next tick). */
  persist(): void {
    this.unpersist();
    const everyMs = ((this.options.ttlSeconds ?? 30) * 1000) / 3;
    this.renewal = setInterval(() => void this.touch().catch(() => undefined), everyMs);
    this.renewal.unref();
  }

  unpersist(): void {
    clearInterval(this.renewal);
    this.renewal = undefined;
  }

  /** Stop renewing and remove the stored object for every client (local values are kept
   * and all count as changed). */
  async delete(): Promise<void> {
    this.unpersist();
    await this.client.unary((o) => this.client.persistables.deletePersistable({ name: this.name }, o));
    this.saved.clear();
  }

  private ttl(): { seconds: bigint; nanos: number } | undefined {
    return this.options.ttlSeconds === undefined ? undefined : duration(this.options.ttlSeconds);
  }
}
