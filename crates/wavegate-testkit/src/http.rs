//! A minimal HTTP/1.1 client for tests: one `GET`, `Connection: close`, the status and the
//! headers back.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a `GET` got back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The `Retry-After` header, if any.
    pub retry_after: Option<String>,
    /// Every header, names as sent, values trimmed.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl HttpReply {
    /// The first header called `name` (case-insensitive), if any.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Sends `GET path` to `addr` and reads the whole reply, within `timeout`.
pub async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> io::Result<HttpReply> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        parse(&raw)
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| io::Error::from(io::ErrorKind::TimedOut))?
}

fn parse(raw: &[u8]) -> io::Result<HttpReply> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| invalid("no end of head"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().ok_or_else(|| invalid("empty reply"))?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_string(), value.trim().to_string()))
        .collect();
    let retry_after =
        headers.iter().find(|(name, _)| name.eq_ignore_ascii_case("retry-after")).map(|(_, value)| value.clone());
    Ok(HttpReply { status, retry_after, headers, body: body.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_retry_after() {
        let reply = parse(b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 3\r\n\r\n").expect("valid");
        assert_eq!((reply.status, reply.retry_after.as_deref()), (429, Some("3")));
        assert_eq!(reply.header("Retry-After"), Some("3"));
        assert!(parse(b"garbage").is_err());
    }
}
