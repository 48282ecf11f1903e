//! Logging setup.

use std::io::Write;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line.
    Json,
}

/// Longest log line written, in bytes; a longer one is cut and ends in `…[cut]`.
pub const MAX_LOG_LINE_BYTES: usize = 16 * 1024;

/// Installs the global subscriber writing to stderr with `filter` (tracing `EnvFilter`
/// syntax: `info`, `service_mirror_controller=debug,kube=warn`).
pub fn init_logging(filter: &str, format: LogFormat) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)?;
    // Colour codes only on a terminal: a log file or a pod log gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(move || OneLine {
            out: std::io::stderr(),
            keep_escapes: ansi,
        });
    let result = match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}

/// Writes each event as exactly one bounded line: fields may hold text from a remote
/// cluster (error bodies, annotation values), and a newline or terminal escape in one
/// must not forge a log line or rewrite the terminal. The formatter hands over one
/// event per write.
struct OneLine<W> {
    out: W,
    /// The formatter's own colour codes (on a terminal).
    keep_escapes: bool,
}

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.out.write_all(&one_line(buf, self.keep_escapes))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

fn one_line(buf: &[u8], keep_escapes: bool) -> Vec<u8> {
    let body = buf.strip_suffix(b"\n").unwrap_or(buf);
    let mut line: Vec<u8> = body
        .iter()
        .take(MAX_LOG_LINE_BYTES)
        .map(|&b| match b {
            0x1b if keep_escapes => b,
            b if b.is_ascii_control() => b' ',
            b => b,
        })
        .collect();
    if body.len() > MAX_LOG_LINE_BYTES {
        // Cut at a character boundary: back off continuation bytes.
        while line.last().is_some_and(|b| b & 0xC0 == 0x80) {
            line.pop();
        }
        line.pop_if(|b| *b >= 0xC0);
        line.extend_from_slice("…[cut]".as_bytes());
    }
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_event_is_one_bounded_line_whatever_its_fields_hold() {
        let cases: Vec<(&[u8], bool, &[u8])> = vec![
            (b"plain line\n", false, b"plain line\n"),
            (
                b"error=forbidden\nFAKE line\r\x1b[2J\n",
                false,
                b"error=forbidden FAKE line  [2J\n",
            ),
            (b"\x1b[33mWARN\x1b[0m x\n", true, b"\x1b[33mWARN\x1b[0m x\n"),
        ];
        for (input, keep, want) in cases {
            assert_eq!(
                one_line(input, keep),
                want,
                "{}",
                String::from_utf8_lossy(input)
            );
        }
        let huge = format!("{}\n", "é".repeat(MAX_LOG_LINE_BYTES));
        let out = String::from_utf8(one_line(huge.as_bytes(), false)).expect("still UTF-8");
        assert!(out.len() <= MAX_LOG_LINE_BYTES + 16);
        assert!(out.ends_with("…[cut]\n"));
        assert_eq!(out.matches('\n').count(), 1);
    }
}
