// Real servers for the client's tests: a redis-server and a busmq-gateway process on free
// loopback ports, with a fresh directory and a random secret; stopped by PID.

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { after, before } from "node:test";
import { fileURLToPath } from "node:url";
import { BusClient } from "../src/index.js";

const HERE = dirname(fileURLToPath(import.meta.url));
/** The repository root (this file runs from clients/typescript/dist/test). */
export const ROOT = resolve(HERE, "..", "..", "..", "..");
const GATEWAY = process.env.BUSMQ_GATEWAY_BIN ?? join(ROOT, ".venv", "bin", "busmq-gateway");
export const PYTHON = join(ROOT, ".venv", "bin", "python");

/** A loopback port that was free a moment ago, below the ephemeral range (an outgoing
 * connection can take an ephemeral one before the server binds it). */
export async function freePort(): Promise<number> {
  for (;;) {
    const port = 10_000 + Math.floor(Math.random() * 22_000);
    const free = await new Promise<boolean>((done) => {
      const server = createServer();
      server.once("error", () => done(false));
      server.listen(port, "127.0.0.1", () => server.close(() => done(true)));
    });
    if (free) {
      return port;
    }
  }
}

/** PEM files of a throwaway CA, a server certificate for 127.0.0.1 and a client certificate
 * (made by tests/support/certs.py). */
export interface Pki {
  dir: string;
  ca: Buffer;
  clientCert: Buffer;
  clientKey: Buffer;
}

export function makePki(dir: string): Pki {
  execFileSync(PYTHON, ["-c", "import sys, pathlib; from tests.support.certs import make_pki; make_pki(pathlib.Path(sys.argv[1]))", dir], { cwd: ROOT });
  const read = (name: string) => readFileSync(join(dir, name));
  return { dir, ca: read("ca.crt"), clientCert: read("client.crt"), clientKey: read("client.key") };
}

export class Deployment {
  readonly secret = randomBytes(24).toString("base64url");
  readonly dir = mkdtempSync(join(tmpdir(), "busmq-ts-"));
  redisPort = 0;
  gatewayPort = 0;
  /** Set by `withMutualTls()`: the gateway then serves TLS and requires client certificates. */
  pki: Pki | undefined;
  private redis: ChildProcess | undefined;
  private gateway: ChildProcess | undefined;
  private readonly helpers: ChildProcess[] = [];

  get url(): string {
    return `${this.pki ? "https" : "http"}://127.0.0.1:${this.gatewayPort}`;
  }

  /** Serve TLS with a throwaway CA and require client certificates it signed. */
  withMutualTls(): this {
    this.pki = makePki(this.dir);
    return this;
  }

  async start(): Promise<this> {
    try {
      this.redisPort = await freePort();
      this.redis = spawn(
        "redis-server",
        ["--port", String(this.redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", this.dir],
        { stdio: ["ignore", "pipe", "inherit"] },
      );
      await waitForLine(this.redis, "Ready to accept connections");
      this.gatewayPort = await freePort();
      await this.startGateway();
      return this;
    } catch (error) {
      await this.stop(); // a server that started is stopped even if the rest failed
      throw error;
    }
  }

  /** Start (or restart) the gateway on the same port. */
  async startGateway(...extra: string[]): Promise<void> {
    this.gateway = spawn(
      GATEWAY,
      [
        "--listen", `127.0.0.1:${this.gatewayPort}`,
        "--redis-url", `redis://127.0.0.1:${this.redisPort}`,
        `--secret=${this.secret}`, // one argument even when the secret starts with "-"
        "--log-format", "text",
        "--grace-seconds", "2",
        ...(this.pki ? ["--tls-cert", join(this.dir, "server.crt"), "--tls-key", join(this.dir, "server.key"), "--tls-client-ca", join(this.dir, "ca.crt")] : []),
        ...extra,
      ],
      {
        stdio: ["ignore", "pipe", "inherit"],
        env: { ...process.env, BUSMQ_LEASE_SECONDS: "3", BUSMQ_GATEWAY_HTTP_LISTEN: "127.0.0.1:0" },
      },
    );
    await waitForLine(this.gateway, "busmq gateway ready");
  }

  /** A Python process serving `service` on the same Redis (tests/support/service_worker.py:
   * ops "double", "count" and "trace"; `traced`: with tracing on); stopped with the
   * deployment. */
  async startPythonHandler(service: string, traced = false): Promise<void> {
    const urls = JSON.stringify([`redis://127.0.0.1:${this.redisPort}`]);
    const args = ["-m", "tests.support.service_worker", urls, service, ...(traced ? ["traced"] : [])];
    const handler = spawn(PYTHON, args, {
      cwd: ROOT,
      stdio: ["ignore", "pipe", "inherit"],
    });
    this.helpers.push(handler);
    await waitForLine(handler, '"serving"');
  }

  /** SIGKILL the gateway (no drain, no goodbye to its streams). */
  async killGateway(): Promise<void> {
    await stop(this.gateway, "SIGKILL");
  }

  /** Stop every process (each one, even if another failed to exit in time), then fail
   * with the first that did not exit. */
  async stop(): Promise<void> {
    const results = await Promise.allSettled(this.helpers.map((helper) => stop(helper, "SIGTERM")));
    results.push(...(await Promise.allSettled([stop(this.gateway, "SIGTERM")])));
    results.push(...(await Promise.allSettled([stop(this.redis, "SIGTERM")])));
    rmSync(this.dir, { recursive: true, force: true });
    const failed = results.find((result) => result.status === "rejected");
    if (failed !== undefined) {
      throw failed.reason;
    }
  }
}

/** How long a program a test runs to its end may take (execFile's `timeout`: killed, the
 * call fails). */
export const CHILD_MS = 60_000;

/** How long a server has to exit after SIGTERM (the gateway drains for `--grace-seconds 2`). */
const EXIT_MS = 20_000;

/** Signal `child` and wait for it to exit. One still running `EXIT_MS` after a SIGTERM is
 * killed, and the stop fails: a server that does not exit on SIGTERM is a fault, and
 * waiting on it for ever would hang the whole suite. */
async function stop(child: ChildProcess | undefined, signal: NodeJS.Signals): Promise<void> {
  if (child === undefined || child.exitCode !== null || child.signalCode !== null) {
    return;
  }
  const exited = new Promise<boolean>((done) => child.once("exit", () => done(true)));
  child.kill(signal);
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<boolean>((done) => {
    timer = setTimeout(() => done(false), EXIT_MS);
  });
  const inTime = await Promise.race([exited, late]);
  clearTimeout(timer);
  if (!inTime) {
    child.kill("SIGKILL");
    await exited;
    throw new Error(`${child.spawnfile} (pid ${child.pid}) did not exit within ${EXIT_MS} ms of ${signal}`);
  }
}

function waitForLine(child: ChildProcess, text: string, timeoutMs = 20_000): Promise<void> {
  return new Promise((resolveReady, reject) => {
    let seen = "";
    const timer = setTimeout(() => reject(new Error(`no "${text}" within ${timeoutMs} ms: ${seen}`)), timeoutMs);
    child.stdout?.on("data", (chunk: Buffer) => {
      if (seen.includes(text)) {
        return; // keep draining the pipe
      }
      seen += chunk.toString();
      if (seen.includes(text)) {
        clearTimeout(timer);
        resolveReady();
      }
    });
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`exited (${code}) before "${text}": ${seen}`));
    });
  });
}

/** Inside a `describe`: one deployment and one client for its tests, started before the
 * first and stopped after the last. Call the returned function in a test to get them. */
export function liveGateway(): () => { deployment: Deployment; client: BusClient } {
  let deployment: Deployment | undefined;
  let client: BusClient | undefined;
  before(async () => {
    deployment = await new Deployment().start();
    client = new BusClient({ url: deployment.url, secret: deployment.secret });
  });
  after(async () => {
    await client?.close();
    await deployment?.stop();
  });
  return () => {
    if (deployment === undefined || client === undefined) {
      throw new Error("liveGateway(): use it inside a test of the same describe");
    }
    return { deployment, client };
  };
}
