//! [`Proc`]: a child process that tests can freeze, thaw and kill.

use crate::HarnessError;
use std::process::{Child, Command, ExitStatus};

/// A child process, killed (SIGKILL) and reaped when dropped.
///
/// Signals other than SIGKILL are sent with the `kill` command, so this crate
/// needs no unsafe code and no libc binding.
#[derive(Debug)]
pub struct Proc {
    child: Child,
    /// What it is, for error messages.
    name: String,
    /// Set once the process was reaped: its pid may then belong to another
    /// process, so no signal is sent to it any more.
    reaped: bool,
}

impl Proc {
    /// Spawns `cmd`; `name` says what it is in error messages.
    pub fn spawn(name: &str, cmd: &mut Command) -> Result<Proc, HarnessError> {
        let child = cmd
            .spawn()
            .map_err(|e| HarnessError::io(format!("spawn {name} ({cmd:?})"), e))?;
        Ok(Proc::from_child(name, child))
    }

    /// Wraps a child spawned elsewhere.
    pub fn from_child(name: &str, child: Child) -> Proc {
        Proc {
            child,
            name: name.to_string(),
            reaped: false,
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What it is.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// SIGSTOP: the process freezes; its sockets stay open and connections
    /// to it hang rather than fail.
    pub fn pause(&self) -> Result<(), HarnessError> {
        self.signal("STOP")
    }

    /// SIGCONT: a paused process runs again.
    pub fn resume(&self) -> Result<(), HarnessError> {
        self.signal("CONT")
    }

    /// SIGKILL, then reaps the process. Idempotent: killing a process that
    /// already exited is a no-op. Returns how it ended.
    pub fn kill9(&mut self) -> Option<ExitStatus> {
        let _ = self.child.kill();
        let status = self.child.wait().ok();
        self.reaped = true;
        status
    }

    /// Whether the process is still running (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        self.try_wait().is_none() && !self.reaped
    }

    /// The exit status if it has exited (without waiting; reaps it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        let status = self.child.try_wait().ok().flatten();
        if status.is_some() {
            self.reaped = true;
        }
        status
    }

    /// The underlying child (for its pipes, say).
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    fn signal(&self, sig: &str) -> Result<(), HarnessError> {
        if self.reaped {
            return Err(HarnessError::Invalid(format!(
                "{} (pid {}) has exited: not sending SIG{sig}",
                self.name,
                self.pid()
            )));
        }
        let pid = self.pid().to_string();
        let status = Command::new("kill")
            .args(["-s", sig, &pid])
            .status()
            .map_err(|e| HarnessError::io(format!("run `kill -s {sig} {pid}`"), e))?;
        if status.success() {
            Ok(())
        } else {
            Err(HarnessError::Invalid(format!(
                "`kill -s {sig} {pid}` ({}) failed with {status}",
                self.name
            )))
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wait_until;
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    use std::sync::mpsc;
    use std::time::Duration;

    /// A `cat` that echoes lines: answers while running, not while paused.
    #[test]
    fn pause_resume_and_kill9() {
        let mut p = Proc::spawn(
            "cat",
            Command::new("cat")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped()),
        )
        .unwrap();
        assert!(p.pid() > 0 && p.is_running());
        let mut stdin = p.child_mut().stdin.take().unwrap();
        let stdout = p.child_mut().stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if tx.send(line.unwrap()).is_err() {
                    return;
                }
            }
        });
        writeln!(stdin, "one").unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "one");

        p.pause().unwrap();
        // The kernel reports a stopped process as state T in /proc.
        let pid = p.pid();
        wait_until("the process to be stopped", Duration::from_secs(10), || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            (state == 'T').then_some(())
        })
        .unwrap();
        writeln!(stdin, "two").unwrap();
        assert!(rx.try_recv().is_err(), "a paused process must not answer");
        p.resume().unwrap();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "two");

        let status = p.kill9().expect("reaped");
        assert!(!status.success());
        assert!(!p.is_running());
        assert!(p.kill9().is_some(), "kill9 is idempotent");
        assert!(p.pause().is_err(), "never signals a reaped pid");
    }
}
