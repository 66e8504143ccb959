// Reads one key N times through ioredis's Cluster with scaleReads: 'slave'.
//
// usage: node read_key.js PORT KEY N
//   Prints one line per read: "GOT <value>", "NIL" or "ERR <message>".
"use strict";
const Redis = require("ioredis");

async function main() {
  const [port, key, n] = [Number(process.argv[2]), process.argv[3], Number(process.argv[4])];
  const cluster = new Redis.Cluster([{ host: "127.0.0.1", port }], { scaleReads: "slave" });
  for (let i = 0; i < n; i++) {
    try {
      const got = await cluster.get(key);
      console.log(got === null ? "NIL" : `GOT ${got}`);
    } catch (e) {
      console.log(`ERR ${e.message.split("\n")[0]}`);
    }
  }
  cluster.disconnect();
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});
