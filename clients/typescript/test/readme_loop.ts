// The README's consumer loop, run by tests/fleet against three gateways behind nginx while
// they are killed and restarted: `node dist/test/readme_loop.js URL SECRET QUEUE`. Prints
// "acked <id> <deliveryCount>" per ack; "error ..." and exit 1 if anything reaches the
// loop; exits 0 on SIGTERM.
import { BusClient } from "../src/index.js";

const [url, secret, name] = process.argv.slice(2) as [string, string, string];
const client = new BusClient({ url, secret });
const queue = client.queue(name);
const deliveries = queue.consume({ mode: "at-least-once", visibilityTimeoutSeconds: 5 });
process.on("SIGTERM", () => void deliveries.stop()); // ends the loop below

try {
  await queue.attach();
  for await (const delivery of deliveries) {
    await delivery.ack();
    process.stdout.write(`acked ${delivery.id} ${delivery.deliveryCount}\n`);
  }
  await client.close();
  process.exit(0);
} catch (error) {
  process.stdout.write(`error ${String(error)} ${(error as Error).stack ?? ""}\n`);
  process.exit(1);
}
