// An ioredis `Redis.Cluster` workload over every Redis type, checked while
// partitions move: the Node.js twin of tests/py/types_workload.py (same
// protocol, same checks, same report).
//
// usage: node types_workload.js PORT STOPFILE REPORT_JSON [WORKERS] [--types string,hash,set,list,zset,multi]
//
// Every worker is an async loop with its own Redis.Cluster client and its
// own keys of every enabled type (`tj{run}.{worker}:{type}:{i}`), so it alone
// writes them and holds a model of each one's exact content:
//   string SET/GET; hash HSET/HINCRBY/HDEL, HGET/HGETALL; set SADD/SREM,
//   SISMEMBER/SCARD/SMEMBERS; list RPUSH/LPOP/LTRIM, LRANGE/LLEN/LINDEX;
//   zset ZADD/ZINCRBY/ZREM, ZSCORE/ZRANGE WITHSCORES/ZCARD; multi: `multi()`
//   over five keys of one hash tag `{tj{run}.{worker}x{i}}`, every transaction
//   writing its number into all of them, read back in one MULTI/EXEC (every
//   key must show the same last transaction: a torn read is an atomicity
//   violation).
// Every write's reply is checked against the model and every read must
// equal it exactly; any difference is a stale read (counted per type), and
// in the final pass (a fresh client reads every key) a lost write. A write
// that failed leaves its key uncertain (old or new content); the next read
// accepts either and adopts it. ioredis follows MOVED/ASK itself (also for
// a transaction whose queued commands were all redirected): counted, not
// errors. Any error reaching the application is an error.
//
// Prints `started` once every worker has acknowledged some writes of every
// enabled type, then `progress writes=...` every half second.
"use strict";
const Redis = require("ioredis");
const fs = require("fs");

const ALL_TYPES = ["string", "hash", "set", "list", "zset", "multi"];
const KEYS_PER_TYPE = 24;
const HASH_FIELDS = [0, 1, 2, 3, 4, 5].map((i) => `f${i}`);
const SET_MEMBERS = [...Array(12).keys()].map((i) => `m${i}`);
const ZSET_MEMBERS = [...Array(8).keys()].map((i) => `z${i}`);
const LIST_MAX = 12;
const TX_KEEP = 4;
const STARTED_AFTER = 5;
const MAX_SAMPLES = 20;
// Key names carry a run id, so a second run against the same cluster starts from empty keys.
const RUN = require("crypto").randomBytes(3).toString("hex");

const redirects = { moved: 0, ask: 0, tryagain: 0 };
const originalHandleError = Redis.Cluster.prototype.handleError;
Redis.Cluster.prototype.handleError = function (error, ttl, handlers) {
  const kind = String(error && error.message).split(" ")[0];
  if (kind === "MOVED") redirects.moved++;
  else if (kind === "ASK") redirects.ask++;
  else if (kind === "TRYAGAIN") redirects.tryagain++;
  return originalHandleError.call(this, error, ttl, handlers);
};

function client(port) {
  return new Redis.Cluster([{ host: "127.0.0.1", port }], {
    redisOptions: { connectTimeout: 20000, commandTimeout: 20000 },
  });
}

// A comparable form of a reply or model content.
function norm(v) {
  if (v instanceof Set) return JSON.stringify([...v].sort());
  if (v instanceof Map) return JSON.stringify([...v.entries()].sort());
  if (Array.isArray(v)) return JSON.stringify(v.map((x) => (typeof x === "number" ? String(x) : x)));
  if (v && typeof v === "object") return JSON.stringify(Object.entries(v).sort());
  if (typeof v === "number") return String(v);
  return JSON.stringify(v);
}
function jsonable(v) {
  if (v instanceof Set) return [...v].sort();
  if (v instanceof Map) return Object.fromEntries(v);
  if (Array.isArray(v)) return v.map(jsonable);
  if (v && typeof v === "object") return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, jsonable(x)]));
  return v;
}
// A zset model (Map member -> score) in ZRANGE WITHSCORES form (flat strings).
function zflat(m) {
  const out = [];
  [...m.entries()]
    .sort((a, b) => a[1] - b[1] || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0))
    .forEach(([mem, s]) => out.push(mem, String(s)));
  return out;
}
function hashObj(m) {
  return Object.fromEntries(m);
}
function shape(t, m) {
  if (t === "zset") return zflat(m);
  if (t === "hash") return hashObj(m);
  return m;
}

class Worker {
  constructor(index, port, types) {
    this.index = index;
    this.types = types;
    this.dataTypes = types.filter((t) => t !== "multi");
    this.keys = {};
    this.model = new Map();
    for (const t of this.dataTypes) {
      this.keys[t] = [...Array(KEYS_PER_TYPE).keys()].map((i) => `tj${RUN}.${index}:${t}:${i}`);
      for (const k of this.keys[t]) this.model.set(k, empty(t));
    }
    this.uncertain = new Map();
    this.groups = types.includes("multi")
      ? [...Array(KEYS_PER_TYPE / 2).keys()].map((i) => `{tj${RUN}.${index}x${i}}`)
      : [];
    this.applied = new Map(this.groups.map((g) => [g, []]));
    this.txUncertain = new Map();
    this.seq = 0;
    this.writes = Object.fromEntries(types.map((t) => [t, 0]));
    this.reads = Object.fromEntries(types.map((t) => [t, 0]));
    this.stale = Object.fromEntries(types.map((t) => [t, 0]));
    this.staleSamples = [];
    this.sampleCap = MAX_SAMPLES; // raised for the final pass's own samples
    this.errors = [];
    this.errorCount = 0;
    this.maxOpMs = 0;
    this.rngState = (index * 7919 + process.pid) >>> 0 || 1;
    this.port = port;
  }
  rand() {
    // xorshift32: reproducible per worker, no dependency.
    let x = this.rngState;
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    this.rngState = x;
    return x / 4294967296;
  }
  pick(a) {
    return a[Math.floor(this.rand() * a.length)];
  }
  next() {
    return ++this.seq;
  }
  error(op, e) {
    this.errorCount++;
    if (this.errors.length < MAX_SAMPLES)
      this.errors.push({ worker: this.index, op, type: e && e.name, message: String(e && e.message), time: Date.now() / 1000 });
  }
  staleRead(t, op, key, got, want) {
    this.stale[t]++;
    if (this.staleSamples.length < this.sampleCap)
      this.staleSamples.push({ worker: this.index, type: t, op, key, got: jsonable(got), want: jsonable(want), time: Date.now() / 1000 });
  }
  async timed(p) {
    const start = process.hrtime.bigint();
    try {
      return await p();
    } finally {
      this.maxOpMs = Math.max(this.maxOpMs, Number(process.hrtime.bigint() - start) / 1e6);
    }
  }

  // [op, call, expected reply, new content]
  planWrite(rc, t, key, old) {
    const r = this.rand();
    if (t === "string") {
      const v = String(this.next());
      return ["set", () => rc.set(key, v), "OK", v];
    }
    if (t === "hash") {
      const neu = new Map(old);
      if (r < 0.5) {
        const f1 = this.pick(HASH_FIELDS);
        const fields = this.rand() < 0.5 ? [f1] : [...new Set([f1, this.pick(HASH_FIELDS)])];
        const args = [];
        let added = 0;
        for (const f of fields) {
          const v = String(this.next());
          if (!old.has(f)) added++;
          neu.set(f, v);
          args.push(f, v);
        }
        return ["hset", () => rc.hset(key, ...args), added, neu];
      }
      if (r < 0.8) {
        const delta = 1 + Math.floor(this.rand() * 5);
        const n = Number(old.get("n") || "0") + delta;
        neu.set("n", String(n));
        return ["hincrby", () => rc.hincrby(key, "n", delta), n, neu];
      }
      const f = this.pick([...HASH_FIELDS, "n"]);
      neu.delete(f);
      return ["hdel", () => rc.hdel(key, f), old.has(f) ? 1 : 0, neu];
    }
    if (t === "set") {
      const m = this.pick(SET_MEMBERS);
      const neu = new Set(old);
      if (r < 0.6) {
        neu.add(m);
        return ["sadd", () => rc.sadd(key, m), old.has(m) ? 0 : 1, neu];
      }
      neu.delete(m);
      return ["srem", () => rc.srem(key, m), old.has(m) ? 1 : 0, neu];
    }
    if (t === "list") {
      if (old.length >= LIST_MAX || (r >= 0.85 && old.length > 0))
        return ["ltrim", () => rc.ltrim(key, -LIST_MAX / 2, -1), "OK", old.slice(-LIST_MAX / 2)];
      if (r < 0.6 || old.length === 0) {
        const vs = this.rand() < 0.5 ? [String(this.next())] : [String(this.next()), String(this.next())];
        const neu = old.concat(vs);
        return ["rpush", () => rc.rpush(key, ...vs), neu.length, neu];
      }
      return ["lpop", () => rc.lpop(key), old[0], old.slice(1)];
    }
    if (t === "zset") {
      const m = this.pick(ZSET_MEMBERS);
      const neu = new Map(old);
      if (r < 0.5) {
        const s = this.next();
        neu.set(m, s);
        return ["zadd", () => rc.zadd(key, s, m), old.has(m) ? 0 : 1, neu];
      }
      if (r < 0.8) {
        const s = (old.get(m) || 0) + 1.5;
        neu.set(m, s);
        return ["zincrby", () => rc.zincrby(key, 1.5, m), String(s), neu];
      }
      neu.delete(m);
      return ["zrem", () => rc.zrem(key, m), old.has(m) ? 1 : 0, neu];
    }
    throw new Error(t);
  }

  async write(rc, t) {
    const key = this.pick(this.keys[t]);
    if (this.uncertain.has(key)) {
      await this.readWhole(rc, t, key);
      if (this.uncertain.has(key)) return;
    }
    const old = this.model.get(key);
    const [op, call, want, neu] = this.planWrite(rc, t, key, old);
    let reply;
    try {
      reply = await this.timed(call);
    } catch (e) {
      this.error(`${op} ${key}`, e);
      this.uncertain.set(key, [old, neu]);
      return;
    }
    this.model.set(key, neu);
    this.writes[t]++;
    if (norm(reply) !== norm(want)) this.staleRead(t, `${op} (reply)`, key, reply, want);
  }

  async readWhole(rc, t, key) {
    let op, got;
    if (t === "string") [op, got] = ["get", await this.timed(() => rc.get(key))];
    else if (t === "hash") [op, got] = ["hgetall", await this.timed(() => rc.hgetall(key))];
    else if (t === "set") [op, got] = ["smembers", new Set(await this.timed(() => rc.smembers(key)))];
    else if (t === "list") [op, got] = ["lrange", await this.timed(() => rc.lrange(key, 0, -1))];
    else [op, got] = ["zrange", await this.timed(() => rc.zrange(key, 0, -1, "WITHSCORES"))];
    this.reads[t]++;
    this.checkWhole(t, op, key, got);
  }

  checkWhole(t, op, key, got) {
    if (this.uncertain.has(key)) {
      const candidates = this.uncertain.get(key);
      for (const c of candidates) {
        if (norm(got) === norm(shape(t, c))) {
          this.model.set(key, c);
          this.uncertain.delete(key);
          return;
        }
      }
      this.staleRead(t, `${op} (uncertain)`, key, got, candidates.map((c) => shape(t, c)));
      return;
    }
    const want = shape(t, this.model.get(key));
    if (norm(got) !== norm(want)) this.staleRead(t, op, key, got, want);
  }

  async read(rc, t) {
    const key = this.pick(this.keys[t]);
    if (t === "string" || this.uncertain.has(key) || this.rand() < 0.4) return this.readWhole(rc, t, key);
    const m = this.model.get(key);
    const r = this.rand();
    let op, got, want;
    if (t === "hash") {
      const f = this.pick([...HASH_FIELDS, "n"]);
      [op, got, want] = ["hget", await this.timed(() => rc.hget(key, f)), m.has(f) ? m.get(f) : null];
    } else if (t === "set") {
      if (r < 0.6) {
        const mem = this.pick(SET_MEMBERS);
        [op, got, want] = ["sismember", await this.timed(() => rc.sismember(key, mem)), m.has(mem) ? 1 : 0];
      } else [op, got, want] = ["scard", await this.timed(() => rc.scard(key)), m.size];
    } else if (t === "list") {
      if (r < 0.5) [op, got, want] = ["llen", await this.timed(() => rc.llen(key)), m.length];
      else {
        const i = Math.floor(this.rand() * 2 * LIST_MAX) - LIST_MAX;
        want = i >= -m.length && i < m.length ? m[i < 0 ? m.length + i : i] : null;
        [op, got] = ["lindex", await this.timed(() => rc.lindex(key, i))];
      }
    } else if (r < 0.6) {
      const mem = this.pick(ZSET_MEMBERS);
      [op, got, want] = ["zscore", await this.timed(() => rc.zscore(key, mem)), m.has(mem) ? String(m.get(mem)) : null];
    } else [op, got, want] = ["zcard", await this.timed(() => rc.zcard(key)), m.size];
    this.reads[t]++;
    if (norm(got) !== norm(want)) this.staleRead(t, op, key, got, want);
  }

  // What a transaction group holds after the transactions `applied`.
  expected(applied) {
    const last = applied.length ? applied[applied.length - 1] : null;
    const keep = applied.slice(-TX_KEEP);
    const out = { string: last === null ? null : String(last) };
    if (this.dataTypes.includes("hash")) out.hash = last === null ? {} : { last: String(last), n: String(applied.length) };
    if (this.dataTypes.includes("set")) out.set = new Set(keep.map(String));
    if (this.dataTypes.includes("list")) out.list = keep.map(String);
    if (this.dataTypes.includes("zset")) out.zset = zflat(new Map(keep.map((v) => [`t${v}`, v])));
    return out;
  }

  async txWrite(rc) {
    const g = this.pick(this.groups);
    if (this.txUncertain.has(g)) {
      await this.txRead(rc, g);
      if (this.txUncertain.has(g)) return;
    }
    const applied = this.applied.get(g);
    const v = this.next();
    const neu = applied.concat([v]);
    const tx = rc.multi();
    tx.set(`${g}string`, String(v));
    if (this.dataTypes.includes("hash")) tx.hset(`${g}hash`, "last", String(v)).hincrby(`${g}hash`, "n", 1);
    if (this.dataTypes.includes("set")) {
      tx.sadd(`${g}set`, String(v));
      if (applied.length >= TX_KEEP) tx.srem(`${g}set`, String(neu[neu.length - TX_KEEP - 1]));
    }
    if (this.dataTypes.includes("list")) tx.rpush(`${g}list`, String(v)).ltrim(`${g}list`, -TX_KEEP, -1);
    if (this.dataTypes.includes("zset")) {
      tx.zadd(`${g}zset`, v, `t${v}`);
      if (applied.length >= TX_KEEP) tx.zrem(`${g}zset`, `t${neu[neu.length - TX_KEEP - 1]}`);
    }
    let replies;
    try {
      replies = await this.timed(() => tx.exec());
    } catch (e) {
      this.error(`multi ${g}`, e);
      this.txUncertain.set(g, [applied, neu]);
      return;
    }
    const failed = (replies || []).find(([err]) => err);
    if (!replies || failed) {
      this.error(`multi ${g}`, failed ? failed[0] : new Error("EXEC answered nil"));
      this.txUncertain.set(g, [applied, neu]);
      return;
    }
    this.applied.set(g, neu);
    this.writes.multi++;
    if (replies[0][1] !== "OK") this.staleRead("multi", "exec (reply)", g, replies, "first reply OK");
  }

  async txRead(rc, g) {
    const tx = rc.multi();
    const order = ["string", ...this.dataTypes.filter((t) => t !== "string")];
    tx.get(`${g}string`);
    for (const t of order.slice(1)) {
      if (t === "hash") tx.hgetall(`${g}hash`);
      else if (t === "set") tx.smembers(`${g}set`);
      else if (t === "list") tx.lrange(`${g}list`, 0, -1);
      else if (t === "zset") tx.zrange(`${g}zset`, 0, -1, "WITHSCORES");
    }
    let replies;
    try {
      replies = await this.timed(() => tx.exec());
    } catch (e) {
      this.error(`multi read ${g}`, e);
      return;
    }
    const failed = (replies || []).find(([err]) => err);
    if (!replies || failed) {
      this.error(`multi read ${g}`, failed ? failed[0] : new Error("EXEC answered nil"));
      return;
    }
    this.reads.multi++;
    const got = {};
    order.forEach((t, i) => {
      got[t] = t === "set" ? new Set(replies[i][1]) : replies[i][1];
    });
    const candidates = this.txUncertain.get(g) || [this.applied.get(g)];
    for (const c of candidates) {
      if (normTx(got) === normTx(this.expected(c))) {
        this.applied.set(g, c);
        this.txUncertain.delete(g);
        return;
      }
    }
    this.staleRead("multi", "multi read", g, got, candidates.map((c) => this.expected(c)));
  }

  async run(stop) {
    const rc = client(this.port);
    while (!stop.stopped) {
      const t = this.pick(this.types);
      try {
        if (t === "multi") {
          await this.txWrite(rc);
          if (this.rand() < 0.5) await this.txRead(rc, this.pick(this.groups));
        } else {
          await this.write(rc, t);
          await this.read(rc, t);
        }
      } catch (e) {
        this.error(`read ${t}`, e);
      }
    }
    rc.disconnect();
  }
}

function empty(t) {
  return { string: null, hash: new Map(), set: new Set(), list: [], zset: new Map() }[t];
}
function normTx(o) {
  return JSON.stringify(Object.keys(o).sort().map((k) => [k, norm(o[k])]));
}

async function verify(port, workers) {
  const rc = client(port);
  let checked = 0;
  let lostCount = 0;
  const lost = [];
  const errors = [];
  for (const w of workers) {
    const before = Object.values(w.stale).reduce((a, b) => a + b, 0);
    const samplesBefore = w.staleSamples.length;
    w.sampleCap = samplesBefore + MAX_SAMPLES;
    for (const t of w.dataTypes) {
      for (const key of w.keys[t]) {
        try {
          await w.readWhole(rc, t, key);
          checked++;
        } catch (e) {
          errors.push({ op: `verify ${key}`, type: e.name, message: String(e.message) });
        }
      }
    }
    for (const g of w.groups) {
      const errs = w.errorCount;
      await w.txRead(rc, g);
      if (w.errorCount === errs) checked++;
    }
    // A difference found by the final pass is a lost write, not a stale read.
    const found = Object.values(w.stale).reduce((a, b) => a + b, 0) - before;
    if (found) {
      lostCount += found;
      lost.push(...w.staleSamples.slice(samplesBefore));
      w.staleSamples = w.staleSamples.slice(0, samplesBefore);
    }
    for (const t of Object.keys(w.stale)) w.stale[t] = w.staleDuring[t];
  }
  rc.disconnect();
  return [checked, lost.slice(0, MAX_SAMPLES), lostCount, errors];
}

async function main() {
  const args = process.argv.slice(2);
  let types = [...ALL_TYPES];
  const ti = args.indexOf("--types");
  if (ti >= 0) {
    types = args[ti + 1].split(",").filter(Boolean);
    args.splice(ti, 2);
  }
  const unknown = types.filter((t) => !ALL_TYPES.includes(t));
  if (unknown.length || !types.includes("string")) {
    console.error(`--types: unknown ${unknown} (string is always on); known: ${ALL_TYPES}`);
    process.exit(2);
  }
  const [port, stopfile, reportPath] = [Number(args[0]), args[1], args[2]];
  const n = args.length > 3 ? Number(args[3]) : 4;
  console.log(`run ${RUN} types ${types.join(",")}`);
  const workers = [...Array(n).keys()].map((i) => new Worker(i, port, types));
  const stop = { stopped: false };
  const began = Date.now();
  const running = workers.map((w) => w.run(stop));
  const sum = (field) => workers.reduce((a, w) => a + Object.values(w[field]).reduce((x, y) => x + y, 0), 0);

  let started = false;
  let lastProgress = 0;
  await new Promise((resolve) => {
    const tick = setInterval(() => {
      if (fs.existsSync(stopfile)) {
        clearInterval(tick);
        resolve();
        return;
      }
      if (!started && workers.every((w) => Math.min(...Object.values(w.writes)) >= STARTED_AFTER)) {
        started = true;
        console.log("started");
      }
      const now = Date.now();
      if (now - lastProgress >= 500) {
        lastProgress = now;
        console.log(
          `progress writes=${sum("writes")} reads=${sum("reads")} errors=${workers.reduce((a, w) => a + w.errorCount, 0)} stale=${sum("stale")}`
        );
      }
    }, 50);
  });
  stop.stopped = true;
  await Promise.all(running);
  const elapsed = (Date.now() - began) / 1000;
  for (const w of workers) w.staleDuring = { ...w.stale };
  const staleDuring = sum("stale");
  const staleSamples = workers.flatMap((w) => w.staleSamples).slice(0, MAX_SAMPLES);
  const errorsBefore = workers.reduce((a, w) => a + w.errorCount, 0);

  let checked = 0, lost = [], lostCount = 0, verifyErrors = [];
  try {
    [checked, lost, lostCount, verifyErrors] = await verify(port, workers);
  } catch (e) {
    verifyErrors = [{ op: "verify", type: e.name, message: String(e.stack) }];
  }
  const verifyTxErrors = workers.reduce((a, w) => a + w.errorCount, 0) - errorsBefore;
  const perType = Object.fromEntries(
    types.map((t) => [
      t,
      {
        writes: workers.reduce((a, w) => a + w.writes[t], 0),
        reads: workers.reduce((a, w) => a + w.reads[t], 0),
        stale: workers.reduce((a, w) => a + w.staleDuring[t], 0),
      },
    ])
  );
  const errors = workers.flatMap((w) => w.errors).concat(verifyErrors);
  const report = {
    client: `ioredis ${require("ioredis/package.json").version}`,
    types,
    threads: n,
    seconds: Math.round(elapsed * 10) / 10,
    writes: Object.values(perType).reduce((a, v) => a + v.writes, 0),
    reads: Object.values(perType).reduce((a, v) => a + v.reads, 0),
    per_type: perType,
    keys: workers.reduce((a, w) => a + w.model.size + w.groups.length, 0),
    stale_reads: staleDuring,
    stale_samples: staleSamples,
    phantom_reads: 0,
    phantom_samples: [],
    errors: errorsBefore + verifyTxErrors + verifyErrors.length,
    error_samples: errors.slice(0, MAX_SAMPLES),
    hung_threads: [],
    verified: checked,
    lost: lostCount,
    lost_samples: lost,
    redirects: { ...redirects },
    max_op_ms: Math.round(Math.max(...workers.map((w) => w.maxOpMs)) * 10) / 10,
    started,
  };
  fs.writeFileSync(reportPath + ".tmp", JSON.stringify(report, null, 2));
  fs.renameSync(reportPath + ".tmp", reportPath);
  console.log(
    `types workload (${report.client}): ${report.writes} writes, ${report.reads} reads in ${elapsed.toFixed(1)}s; ` +
      `${report.stale_reads} stale, ${report.errors} errors, ${lostCount}/${checked} keys lost; ` +
      `${redirects.moved} MOVED, ${redirects.ask} ASK, ${redirects.tryagain} TRYAGAIN; slowest op ${report.max_op_ms.toFixed(0)} ms; ` +
      `per type ${JSON.stringify(perType)}`
  );
  process.exit(0);
}

main().catch((e) => {
  console.error(e);
  process.exit(2);
});
