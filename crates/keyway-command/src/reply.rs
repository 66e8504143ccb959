//! Replies node and proxy give alike, before or without executing a command.

use bytes::Bytes;
use keyway_resp::Frame;

/// The Redis version Keyway reports to clients (for feature detection).
pub const REDIS_COMPAT_VERSION: &str = "7.0.0";

/// A key longer than [`crate::MAX_KEY_BYTES`] in a command that would create it.
pub const KEY_TOO_LONG: &str = "ERR key is too long (max 65529 bytes)";

/// `EXEC` of a transaction flagged by an error while it was queued.
pub const EXECABORT: &str = "EXECABORT Transaction discarded because of previous errors.";

/// `-ERR unknown command 'x', with args beginning with: 'a' 'b' ` as Redis formats it.
pub fn unknown_command(args: &[Bytes]) -> Frame {
    let mut rest = String::new();
    for arg in &args[1..] {
        if rest.len() >= 128 {
            break;
        }
        let room = 128 - rest.len();
        let text = String::from_utf8_lossy(arg);
        let cut: String = text.chars().take(room).collect();
        rest.push_str(&format!("'{cut}' "));
    }
    let name: String = String::from_utf8_lossy(&args[0])
        .chars()
        .take(128)
        .collect();
    Frame::Error(format!(
        "ERR unknown command '{name}', with args beginning with: {rest}"
    ))
}
