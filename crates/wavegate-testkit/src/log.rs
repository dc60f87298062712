//! The server's log files and reading their tail for error messages.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// How many lines of each log an error message carries.
const TAIL_LINES: usize = 25;

/// The two files a server writes to inside its temp dir: Redis's own log
/// (`--logfile`) and its captured stdout/stderr (where fatal config errors go,
/// before the log file is opened).
#[derive(Debug, Clone)]
pub(crate) struct LogFiles {
    redis: PathBuf,
    stdio: PathBuf,
}

/// Where each log ended when a server process was launched, so an error only
/// shows what that process wrote (restarts append to the same files).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogMark {
    redis: u64,
    stdio: u64,
}

impl LogFiles {
    pub(crate) fn in_dir(dir: &Path) -> Self {
        Self { redis: dir.join("redis.log"), stdio: dir.join("redis.stdio.log") }
    }

    /// Redis's log file.
    pub(crate) fn redis_log(&self) -> &Path {
        &self.redis
    }

    /// Opens the stdout/stderr capture file for appending.
    pub(crate) fn open_stdio(&self) -> io::Result<File> {
        File::options().create(true).append(true).open(&self.stdio)
    }

    /// The current end of both files.
    pub(crate) fn mark(&self) -> LogMark {
        LogMark { redis: file_len(&self.redis), stdio: file_len(&self.stdio) }
    }

    /// Everything written to both files since `mark`.
    pub(crate) fn since(&self, mark: LogMark) -> LogText {
        LogText { redis: read_from(&self.redis, mark.redis), stdio: read_from(&self.stdio, mark.stdio) }
    }
}

/// The text a server process wrote to its logs.
#[derive(Debug)]
pub(crate) struct LogText {
    redis: String,
    stdio: String,
}

impl LogText {
    /// Whether the server failed because its port was taken.
    pub(crate) fn port_in_use(&self) -> bool {
        const NEEDLE: &str = "Address already in use";
        self.redis.contains(NEEDLE) || self.stdio.contains(NEEDLE)
    }

    /// The last lines of both files, labelled, for an error message.
    pub(crate) fn tail(&self) -> String {
        let mut out = String::new();
        for (label, text) in [("redis.log", &self.redis), ("stdout/stderr", &self.stdio)] {
            out.push_str(&format!("--- {label} (last {TAIL_LINES} lines) ---\n"));
            let lines: Vec<&str> = text.lines().collect();
            if lines.is_empty() {
                out.push_str("(empty)\n");
            }
            for line in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |meta| meta.len())
}

fn read_from(path: &Path, offset: u64) -> String {
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        file.seek(SeekFrom::Start(offset))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    read().unwrap_or_else(|err| match err.kind() {
        io::ErrorKind::NotFound => "(not created)".to_owned(),
        _ => format!("(could not read {}: {err})", path.display()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_mark_shows_only_new_text_and_tail_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let logs = LogFiles::in_dir(dir.path());
        std::fs::write(logs.redis_log(), "old line\n").unwrap();
        let mark = logs.mark();
        let mut text = String::new();
        for i in 0..100 {
            text.push_str(&format!("line {i}\n"));
        }
        text.push_str("bind: Address already in use\n");
        std::fs::write(logs.redis_log(), format!("old line\n{text}")).unwrap();

        let since = logs.since(mark);
        assert!(since.port_in_use());
        let tail = since.tail();
        assert!(!tail.contains("old line"), "{tail}");
        assert!(!tail.contains("line 0\n"), "{tail}");
        assert!(tail.contains("line 99\n"), "{tail}");
        assert!(tail.contains("Address already in use"), "{tail}");
        // The stdio file does not exist yet: reported, not a panic.
        assert!(tail.contains("(not created)"), "{tail}");
    }
}
