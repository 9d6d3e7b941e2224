//! The attempt's logs: the guest's `log` calls and its stdout/stderr, bounded per line
//! and per attempt, batched to the journal without blocking the guest.

use super::*;

/// How much of stderr is kept (outside the log budget) to find a Rust panic message.
pub(crate) const STDERR_TAIL_BYTES: usize = 8 << 10;

/// Longest stdout/stderr line buffered: a longer one is cut into lines of this size.
pub(crate) const MAX_STREAM_LINE_BYTES: usize = 16 << 10;

/// Turns guest output into log lines, escaped (see [`escape_controls`]) and charged to
/// one per-attempt budget of bytes (as stored, escapes included, plus one per line) and
/// lines.
///
/// Past the budget lines are dropped *silently* for the guest, with a single marker line
/// in the log: a write error would make the guest's `println!` panic, turning
/// chatty-but-correct code into a failed attempt.
pub(crate) struct LogSink {
    /// Stamps the lines.
    clock: Arc<dyn Clock>,
    journal: Arc<dyn Journal>,
    attempt: u32,
    max_bytes: usize,
    max_lines: usize,
    state: Mutex<SinkState>,
}

#[derive(Default)]
pub(crate) struct SinkState {
    bytes: usize,
    lines: usize,
    truncated: bool,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    stderr_tail: Vec<u8>,
}

impl LogSink {
    pub(crate) fn new(
        journal: Arc<dyn Journal>,
        attempt: u32,
        max_bytes: usize,
        max_lines: usize,
        clock: Arc<dyn Clock>,
    ) -> LogSink {
        LogSink {
            clock,
            journal,
            attempt,
            max_bytes,
            max_lines,
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SinkState> {
        // A panic while holding this lock can only come from a bug here; the buffered
        // text is still fine to use.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn line(&self, level: LogLevel, source: LogSource, message: String) -> LogLine {
        LogLine {
            attempt: self.attempt,
            at: self.clock.now_ms(),
            level,
            source,
            message,
        }
    }

    /// A line from wasq itself about this attempt; not charged to the budget. It may
    /// quote the guest (a URL, a backtrace), so it is escaped too, newlines apart.
    pub(crate) fn host(&self, level: LogLevel, message: String) {
        let (message, _) = escape_controls(&message, true, usize::MAX);
        self.journal.log(self.line(level, LogSource::Host, message));
    }

    /// Escapes `text` and keeps it as a line if the budget allows, or as much of it as
    /// fits; past the budget, adds the one truncation marker.
    fn push(
        &self,
        st: &mut SinkState,
        out: &mut Vec<LogLine>,
        level: LogLevel,
        source: LogSource,
        text: &str,
    ) {
        if st.truncated {
            return;
        }
        if st.lines >= self.max_lines {
            return self.overflowed(st, out, format!("{} lines", self.max_lines));
        }
        // +1 as if for the newline: empty lines must not be free, or a guest could
        // write unlimited numbers of them.
        let room = self.max_bytes - st.bytes;
        if room == 0 {
            return self.overflowed(st, out, format!("{} bytes", self.max_bytes));
        }
        let (escaped, complete) = escape_controls(text, false, room - 1);
        if complete || !escaped.is_empty() {
            st.bytes += escaped.len() + 1;
            st.lines += 1;
            out.push(self.line(level, source, escaped));
        }
        if !complete {
            self.overflowed(st, out, format!("{} bytes", self.max_bytes));
        }
    }

    /// The first time the budget overflows: drop the partial lines (there is no room for
    /// them) and add the single truncation notice.
    fn overflowed(&self, st: &mut SinkState, out: &mut Vec<LogLine>, limit: String) {
        if !st.truncated {
            st.truncated = true;
            st.stdout = Vec::new();
            st.stderr = Vec::new();
            out.push(self.line(
                LogLevel::Warn,
                LogSource::Host,
                format!(
                    "log output truncated at {limit}, this attempt's log limit: the rest of \
                     its log is dropped (the attempt goes on)"
                ),
            ));
        }
    }

    fn flush_partial(&self, st: &mut SinkState, out: &mut Vec<LogLine>) {
        for (source, level) in [
            (LogSource::Stdout, LogLevel::Info),
            (LogSource::Stderr, LogLevel::Warn),
        ] {
            let buf = match source {
                LogSource::Stdout => std::mem::take(&mut st.stdout),
                _ => std::mem::take(&mut st.stderr),
            };
            if !buf.is_empty() {
                self.push(st, out, level, source, &String::from_utf8_lossy(&buf));
            }
        }
    }

    fn emit(&self, lines: Vec<LogLine>) {
        for l in lines {
            self.journal.log(l);
        }
    }

    pub(crate) fn guest(&self, level: LogLevel, message: String) {
        let mut out = Vec::new();
        self.push(
            &mut self.lock(),
            &mut out,
            level,
            LogSource::Guest,
            &message,
        );
        self.emit(out);
    }

    fn stream(&self, source: LogSource, bytes: &[u8]) {
        let mut out = Vec::new();
        {
            let mut guard = self.lock();
            let st = &mut *guard;
            if source == LogSource::Stderr {
                st.stderr_tail.extend_from_slice(bytes);
                let excess = st.stderr_tail.len().saturating_sub(STDERR_TAIL_BYTES);
                st.stderr_tail.drain(..excess);
            }
            let level = match source {
                LogSource::Stdout => LogLevel::Info,
                _ => LogLevel::Warn,
            };
            for &b in bytes {
                if st.truncated {
                    break;
                }
                let buf = match source {
                    LogSource::Stdout => &mut st.stdout,
                    _ => &mut st.stderr,
                };
                if b == b'\n' {
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                    let line = std::mem::take(buf);
                    // Blank lines (Rust's panic output starts with one) carry nothing.
                    if !line.is_empty() {
                        self.push(st, &mut out, level, source, &String::from_utf8_lossy(&line));
                    }
                } else {
                    buf.push(b);
                    if buf.len() >= MAX_STREAM_LINE_BYTES {
                        let line = std::mem::take(buf);
                        self.push(st, &mut out, level, source, &String::from_utf8_lossy(&line));
                    }
                }
            }
        }
        self.emit(out);
    }

    /// Emits the unterminated last lines; called once the guest has stopped.
    pub(crate) fn finish(&self) {
        let mut out = Vec::new();
        self.flush_partial(&mut self.lock(), &mut out);
        self.emit(out);
    }

    /// The last Rust panic message written to stderr, e.g. "panicked at src/lib.rs:3:5: boom".
    pub(crate) fn panic_message(&self) -> Option<String> {
        let st = self.lock();
        let tail = String::from_utf8_lossy(&st.stderr_tail);
        let at = tail.rfind("panicked at ")?;
        let text: Vec<&str> = tail[at..]
            .lines()
            .take_while(|l| !l.starts_with("note: run with `RUST_BACKTRACE"))
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        Some(truncate_utf8(text.join(" "), 2048))
    }
}

/// stdout or stderr of one attempt.
pub(crate) struct LogStream {
    pub(crate) sink: Arc<LogSink>,
    pub(crate) source: LogSource,
}

impl IsTerminal for LogStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogStream {
    // Our own OutputStream rather than the default AsyncWriteStream adapter: writes land
    // synchronously, so everything the guest printed is in the log (in order) by the time
    // the call returns, with no background task to drain.
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(LogWriter {
            sink: self.sink.clone(),
            source: self.source,
        })
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(LogWriter {
            sink: self.sink.clone(),
            source: self.source,
        })
    }
}

pub(crate) struct LogWriter {
    sink: Arc<LogSink>,
    source: LogSource,
}

/// What `check-write` grants per call; the guest loops for larger writes.
pub(crate) const WRITE_PERMIT: usize = 64 << 10;

#[async_trait::async_trait]
impl Pollable for LogWriter {
    async fn ready(&mut self) {}
}

#[async_trait::async_trait]
impl OutputStream for LogWriter {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.sink.stream(self.source, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl tokio::io::AsyncWrite for LogWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.sink.stream(self.source, buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasq_core::SystemClock;

    #[derive(Default)]
    struct Lines(Mutex<Vec<LogLine>>);

    #[async_trait::async_trait]
    impl Journal for Lines {
        async fn complete_step(&self, _: &str, _: u32, _: &[u8]) -> Result<(), JournalError> {
            Ok(())
        }
        async fn send_event(
            &self,
            _: &str,
            _: serde_json::Value,
            _: &str,
        ) -> Result<(), JournalError> {
            Ok(())
        }
        async fn start_run(&self, _: &str, _: &[u8], _: &str) -> Result<String, JournalError> {
            Err(JournalError::Failed("no runs here".into()))
        }
        async fn load_step(&self, _: &str, _: u32) -> Result<Vec<u8>, JournalError> {
            Err(JournalError::Failed("no steps here".into()))
        }
        fn log(&self, line: LogLine) {
            self.0.lock().unwrap().push(line);
        }
        fn progress(&self, _: Progress) {}
    }

    fn texts(j: &Lines) -> Vec<(LogSource, String)> {
        j.0.lock()
            .unwrap()
            .iter()
            .map(|l| (l.source, l.message.clone()))
            .collect()
    }

    const LINES: usize = 10_000;

    #[test]
    fn stdout_lines_split_and_cap_drops_silently() {
        let j = Arc::new(Lines::default());
        // "hello\n" + "world\n" = 12 bytes; 3 more hold "mo" and the newline.
        let sink = LogSink::new(j.clone(), 1, 15, LINES, Arc::new(SystemClock));
        sink.stream(LogSource::Stdout, b"hello\r\n\nwor");
        sink.stream(LogSource::Stdout, b"ld\nmore text\n");
        sink.stream(LogSource::Stdout, b"dropped\n");
        sink.finish();
        assert_eq!(
            texts(&j),
            vec![
                (LogSource::Stdout, "hello".into()),
                (LogSource::Stdout, "world".into()),
                (LogSource::Stdout, "mo".into()),
                (
                    LogSource::Host,
                    "log output truncated at 15 bytes, this attempt's log limit: the rest of \
                     its log is dropped (the attempt goes on)"
                        .into()
                ),
            ]
        );
    }

    #[test]
    fn guest_lines_share_the_budget_and_empty_lines_cost() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 10, LINES, Arc::new(SystemClock));
        sink.guest(LogLevel::Info, "abc".into());
        sink.stream(LogSource::Stderr, b"de\n");
        for _ in 0..10 {
            sink.guest(LogLevel::Info, String::new());
        }
        sink.guest(LogLevel::Info, "never".into());
        let got = texts(&j);
        assert_eq!(
            got[..5],
            [
                (LogSource::Guest, "abc".into()),
                (LogSource::Stderr, "de".into()),
                (LogSource::Guest, "".into()),
                (LogSource::Guest, "".into()),
                (LogSource::Guest, "".into()),
            ]
        );
        assert_eq!(got.len(), 6, "{got:?}");
        assert!(got[5].1.starts_with("log output truncated at 10 bytes"));
    }

    #[test]
    fn the_line_budget_ends_with_one_marker() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 1 << 20, 3, Arc::new(SystemClock));
        for i in 0..100 {
            sink.guest(LogLevel::Info, format!("line {i}"));
            sink.stream(LogSource::Stdout, b"out\n");
        }
        sink.finish();
        let got = texts(&j);
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[2], (LogSource::Guest, "line 1".into()));
        assert!(
            got[3].1.starts_with("log output truncated at 3 lines"),
            "{got:?}"
        );
    }

    #[test]
    fn control_characters_are_escaped() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 1 << 20, LINES, Arc::new(SystemClock));
        sink.guest(
            LogLevel::Info,
            "\x1b[31mred\x1b[0m\nINFO forged line\rover\x07\u{9b}2J\u{202e}evil\tok".into(),
        );
        sink.stream(LogSource::Stdout, b"\x1b]0;title\x07 \x00 \x7f\n");
        sink.host(LogLevel::Error, "backtrace:\n  0: \x1b[2Jf".into());
        assert_eq!(
            texts(&j),
            vec![
                (
                    LogSource::Guest,
                    "\\u{1b}[31mred\\u{1b}[0m\\nINFO forged line\\rover\\u{7}\\u{9b}2J\\u{202e}evil\tok"
                        .into()
                ),
                (LogSource::Stdout, "\\u{1b}]0;title\\u{7} \\u{0} \\u{7f}".into()),
                (LogSource::Host, "backtrace:\n  0: \\u{1b}[2Jf".into()),
            ]
        );
    }

    #[test]
    fn escapes_count_against_the_budget_and_are_never_cut() {
        let j = Arc::new(Lines::default());
        // 4 + 1 bytes fit: "ab" and the start of an escape would not.
        let sink = LogSink::new(j.clone(), 1, 8, LINES, Arc::new(SystemClock));
        sink.guest(LogLevel::Info, "ab\x1bcd".into());
        let got = texts(&j);
        assert_eq!(got[0], (LogSource::Guest, "ab".into()));
        assert!(got[1].1.contains("truncated at 8 bytes"), "{got:?}");
    }

    #[test]
    fn long_stream_lines_are_cut() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 1 << 20, LINES, Arc::new(SystemClock));
        sink.stream(
            LogSource::Stdout,
            &vec![b'x'; MAX_STREAM_LINE_BYTES * 2 + 5],
        );
        sink.finish();
        let lens: Vec<usize> = texts(&j).iter().map(|(_, t)| t.len()).collect();
        assert_eq!(lens, [MAX_STREAM_LINE_BYTES, MAX_STREAM_LINE_BYTES, 5]);
    }

    #[test]
    fn panic_message_is_found_in_stderr() {
        let j = Arc::new(Lines::default());
        let sink = LogSink::new(j.clone(), 1, 1 << 20, LINES, Arc::new(SystemClock));
        sink.stream(
            LogSource::Stderr,
            b"\nthread '<unnamed>' panicked at src/lib.rs:3:5:\nboom\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n",
        );
        assert_eq!(
            sink.panic_message().as_deref(),
            Some("panicked at src/lib.rs:3:5: boom")
        );
    }
}
