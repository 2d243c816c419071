//! Process logs: every record one line, in the format `log.format` chooses.
//!
//! Line-based shippers (journald, Docker, Fluent Bit) split records at
//! newlines, so a value that holds one (an error chain, a config problem
//! list) is escaped as `\n` rather than allowed to start a new record.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogFormat;

/// Installs the global subscriber (`TOLLGATE_LOG` filters, default `info`);
/// false if one was installed already.
pub fn init(format: LogFormat) -> bool {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG")
        .unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(OneLine);
    match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init()
            .is_ok(),
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .try_init()
            .is_ok(),
    }
}

/// Stdout, with a record's inner newlines escaped.
#[derive(Clone, Copy)]
pub struct OneLine;

impl<'a> MakeWriter<'a> for OneLine {
    type Writer = OneLineWriter<io::Stdout>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLineWriter(io::stdout())
    }
}

pub struct OneLineWriter<W>(pub W);

impl<W: Write> Write for OneLineWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    /// The formatter hands over a whole record ending in its newline; only
    /// that last newline stays one.
    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        let body = buf.strip_suffix(b"\n").unwrap_or(buf);
        if !body.contains(&b'\n') {
            return self.0.write_all(buf);
        }
        let mut line = Vec::with_capacity(buf.len() + 8);
        for &b in body {
            if b == b'\n' {
                line.extend_from_slice(b"\\n");
            } else {
                line.push(b);
            }
        }
        if body.len() < buf.len() {
            line.push(b'\n');
        }
        self.0.write_all(&line)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_with_inner_newlines_is_written_as_one_line() {
        let mut w = OneLineWriter(Vec::new());
        w.write_all(b"ERROR reload rejected:\n  line 3: bad\n")
            .unwrap();
        assert_eq!(w.0, b"ERROR reload rejected:\\n  line 3: bad\n");
        let mut w = OneLineWriter(Vec::new());
        w.write_all(b"INFO fine\n").unwrap();
        assert_eq!(w.0, b"INFO fine\n");
    }
}
