//! [`ctl`]: one `keyway ctl` call with a deadline (moved out of
//! `cluster.rs` unchanged).

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// Runs `keyway ctl --meta URL ARGS...` with a deadline (killed past it);
/// its stdout on success, else what went wrong (stderr's last line).
pub async fn ctl(
    bin: &Path,
    meta_url: &str,
    secret_file: &Path,
    args: &[&str],
    within: Duration,
) -> Result<String, String> {
    let child = tokio::process::Command::new(bin)
        .arg("ctl")
        .arg("--meta")
        .arg(meta_url)
        .arg("--cluster-secret-file")
        .arg(secret_file)
        .args(args)
        .env("KEYWAY_LOG", "error")
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("spawn keyway ctl: {e}"))?;
    match tokio::time::timeout(within, child.wait_with_output()).await {
        Err(_) => Err(format!(
            "`ctl {}` timed out after {within:?}",
            args.join(" ")
        )),
        Ok(Err(e)) => Err(format!("`ctl {}`: {e}", args.join(" "))),
        Ok(Ok(out)) if out.status.success() => {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        }
        Ok(Ok(out)) => {
            let err = String::from_utf8_lossy(&out.stderr);
            // anyhow's `Error: ...` line (a backtrace may follow it).
            let why = err
                .lines()
                .find(|l| l.starts_with("Error:"))
                .or_else(|| err.trim().lines().last())
                .unwrap_or("");
            Err(format!(
                "`ctl {}` failed ({}): {why}",
                args.join(" "),
                out.status
            ))
        }
    }
}
