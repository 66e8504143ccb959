//! The scripting commands' rows of the command table (Redis 7.0.15's
//! `COMMAND INFO` / `COMMAND DOCS`). They run in `keyway_node::script`, not
//! through `cmd::parse`; the family only marks them as data commands with
//! keys (so the proxy routes them by their `numkeys` keys).

use super::table::{CommandSpec, Family, Strs, data};

const EVAL_FLAGS: Strs = &[
    "noscript",
    "stale",
    "skip_monitor",
    "no_mandatory_keys",
    "movablekeys",
];
const EVAL_RO_FLAGS: Strs = &[
    "readonly",
    "noscript",
    "stale",
    "skip_monitor",
    "no_mandatory_keys",
    "movablekeys",
];
const ACL: Strs = &["@slow", "@scripting"];
const COMPLEXITY: &str = "Depends on the script that is executed.";

const fn script(
    name: &'static str,
    flags: Strs,
    key_spec: Strs,
    since: &'static str,
    summary: &'static str,
) -> CommandSpec {
    data(
        "scripting",
        Family::Script,
        name,
        -3,
        flags,
        ACL,
        key_spec,
        since,
        summary,
    )
    .keynum(2)
    .complexity(COMPLEXITY)
}

#[rustfmt::skip]
pub static SCRIPT_COMMANDS: &[CommandSpec] = &[
    script("eval", EVAL_FLAGS, &["RW", "access", "update"], "2.6.0", "Execute a Lua script server side")
        .notes("We cannot tell how the keys will be used so we assume the worst, RW and UPDATE"),
    script("evalsha", EVAL_FLAGS, &["RW", "access", "update"], "2.6.0", "Execute a Lua script server side"),
    script("eval_ro", EVAL_RO_FLAGS, &["RO", "access"], "7.0.0", "Execute a read-only Lua script server side")
        .notes("We cannot tell how the keys will be used so we assume the worst, RO and ACCESS"),
    script("evalsha_ro", EVAL_RO_FLAGS, &["RO", "access"], "7.0.0", "Execute a read-only Lua script server side"),
];
