//! A small synchronous QMP client: JSON lines over a unix socket.
//!
//! Hand-written rather than with the `qapi` crate because that crate's
//! generated `query-blockstats` result fails to parse on QEMU < 8.1 (Debian
//! 12 ships 7.2), and iofloor needs only a handful of commands whose answers
//! it reads as plain JSON with defaults.

use crate::error::{HostError, Result};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Qmp {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

fn qmp_err(path: &Path, message: impl Into<String>) -> HostError {
    HostError::Command {
        what: format!("QMP {}", path.display()),
        message: message.into(),
    }
}

impl Qmp {
    /// Connects, reads the greeting and enters command mode. `timeout` bounds
    /// every read and write, so a hung QEMU cannot hang the caller.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp> {
        let stream = UnixStream::connect(path).map_err(|e| HostError::io(path, e))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| HostError::io(path, e))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| HostError::io(path, e))?;
        let writer = stream.try_clone().map_err(|e| HostError::io(path, e))?;
        let mut qmp = Qmp {
            path: path.to_path_buf(),
            reader: BufReader::new(stream),
            writer,
        };
        let greeting = qmp.read_message()?;
        if !matches!(parse_reply(&greeting), Ok(Reply::Greeting)) {
            return Err(qmp_err(
                path,
                format!("no QMP greeting, got {}", greeting.trim()),
            ));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    fn read_message(&mut self) -> Result<String> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| HostError::io(&self.path, e))?;
        if n == 0 {
            return Err(qmp_err(&self.path, "connection closed"));
        }
        Ok(line)
    }

    /// Runs one command and returns its `return` value; a QMP error becomes an
    /// error naming the command. Asynchronous events are skipped.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> Result<Value> {
        let mut msg = json!({ "execute": command });
        if let Some(args) = arguments {
            msg["arguments"] = args;
        }
        let mut text = msg.to_string();
        text.push('\n');
        self.writer
            .write_all(text.as_bytes())
            .map_err(|e| HostError::io(&self.path, e))?;
        loop {
            let line = self.read_message()?;
            match parse_reply(&line) {
                Ok(Reply::Event) => continue,
                Ok(Reply::Return(value)) => return Ok(value),
                Ok(Reply::Error(desc)) => {
                    return Err(qmp_err(&self.path, format!("{command}: {desc}")))
                }
                Ok(Reply::Greeting) => {
                    return Err(qmp_err(&self.path, format!("{command}: a second greeting")))
                }
                Err(e) => return Err(qmp_err(&self.path, format!("{command}: {e}"))),
            }
        }
    }
}

/// One line a QMP monitor sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// The greeting a monitor sends first.
    Greeting,
    /// An asynchronous event, skipped while waiting for an answer.
    Event,
    /// A command's `return` value.
    Return(Value),
    /// A command's `error`, by its `desc`.
    Error(String),
}

/// A line from a QMP monitor that is none of the replies it may send.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    #[error("answered garbage ({source}): {line}")]
    Garbage {
        line: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("unexpected answer {0}")]
    Unexpected(Value),
}

/// Reads one line of a QMP monitor's output; anything but an event, a
/// return or an error is an error that quotes the line.
pub fn parse_reply(line: &str) -> std::result::Result<Reply, ReplyError> {
    let reply: Value = serde_json::from_str(line).map_err(|source| ReplyError::Garbage {
        line: line.trim().to_string(),
        source,
    })?;
    if reply.get("QMP").is_some() {
        return Ok(Reply::Greeting);
    }
    if reply.get("event").is_some() {
        return Ok(Reply::Event);
    }
    if let Some(value) = reply.get("return") {
        return Ok(Reply::Return(value.clone()));
    }
    if let Some(err) = reply.get("error") {
        let desc = err
            .get("desc")
            .and_then(Value::as_str)
            .unwrap_or("unknown error");
        return Ok(Reply::Error(desc.to_string()));
    }
    Err(ReplyError::Unexpected(reply))
}
