// ioredis Cluster with scaleReads: 'slave' against a replicated Keyway cluster.
//
// usage: node replica_reads.js PORT KEYS ROUNDS
//   Writes KEYS keys, then overwrites each ROUNDS times, every value unique;
//   after each acknowledged write it reads the key back twice (with
//   scaleReads 'slave' ioredis sends every read to one of the slot's
//   replicas) and counts a read that does not return the value just
//   acknowledged as stale. Prints "reads N stale S" and exits non-zero if
//   S > 0 or on any error.
"use strict";
const Redis = require("ioredis");
const crypto = require("crypto");

async function main() {
  const [port, keys, rounds] = process.argv.slice(2).map(Number);
  const cluster = new Redis.Cluster([{ host: "127.0.0.1", port }], {
    scaleReads: "slave",
  });
  const run = crypto.randomBytes(4).toString("hex");
  let reads = 0;
  let stale = 0;
  for (let r = 0; r <= rounds; r++) {
    for (let i = 0; i < keys; i++) {
      const key = `rr:${run}:${i}`;
      const value = `${run}:${i}:${r}`;
      const ok = await cluster.set(key, value);
      if (ok !== "OK") throw new Error(`SET ${key} answered ${ok}`);
      for (let k = 0; k < 2; k++) {
        const got = await cluster.get(key);
        reads++;
        if (got !== value) {
          stale++;
          console.log(`stale read ${key}: ${got}, acknowledged ${value}`);
        }
      }
    }
  }
  console.log(`reads ${reads} stale ${stale}`);
  cluster.disconnect();
  process.exit(stale ? 1 : 0);
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});
