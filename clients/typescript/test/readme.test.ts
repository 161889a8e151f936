// The README's example, run as written against a live gateway (only its address differs:
// the test's gateway listens on a free port, not 8443).

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { promisify } from "node:util";
import { test } from "node:test";
import { CHILD_MS, Deployment, ROOT } from "./support.js";

const PACKAGE = resolve(ROOT, "clients", "typescript");

test("the README example runs as written against scripts/run.sh's kind of gateway", async () => {
  const readme = readFileSync(join(PACKAGE, "README.md"), "utf8");
  const example = /```ts\n([\s\S]*?)```/.exec(readme)?.[1] ?? "";
  assert.ok(example.includes("http://127.0.0.1:8443"), "the README has its example");
  const deployment = await new Deployment().start();
  const dir = mkdtempSync(join(tmpdir(), "busmq-ts-readme-"));
  try {
    mkdirSync(join(dir, "node_modules", "@busmq"), { recursive: true });
    symlinkSync(PACKAGE, join(dir, "node_modules", "@busmq", "client"));
    writeFileSync(join(dir, ".busmq-secret"), `${deployment.secret}\n`);
    writeFileSync(join(dir, "example.mjs"), example.replace("http://127.0.0.1:8443", deployment.url));
    const { stdout } = await promisify(execFile)(process.execPath, ["example.mjs"], { cwd: dir, timeout: CHILD_MS });
    assert.equal(stdout, "1n { order: 1 }\n2n { order: 2 }\n");

    // The later examples continue the first one's client.
    const fences = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] ?? "");
    const prelude = example.slice(0, example.indexOf("const orders"));
    assert.equal(fences.length, 2, "the README's examples");
    const persistables = `${prelude}${fences[1]}await client.close();\n`;
    writeFileSync(join(dir, "persistables.mjs"), persistables.replace("http://127.0.0.1:8443", deployment.url));
    const second = await promisify(execFile)(process.execPath, ["persistables.mjs"], { cwd: dir, timeout: CHILD_MS });
    assert.equal(second.stdout, "[ 'items', 'total' ]\n");
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await deployment.stop();
  }
});
