//! A request body read whole, within bounds: both front doors (the
//! Functions host's, `host`; Event Grid's webhook, `webhook`) read theirs so.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use futures::{Stream, StreamExt};
use warp::http::StatusCode;

/// Bounds on what one request may take (built by `config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Larger bodies get 413 (`MAX_BODY_BYTES`).
    pub max_body_bytes: usize,
    /// A body not fully received in this time gets 408
    /// (`BODY_READ_TIMEOUT_MS`): a slow or incomplete body (a
    /// `Content-Length` larger than what is sent) cannot hold a connection.
    pub body_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 4 * 1024 * 1024,
            body_read_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a body was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyError {
    /// Over `MAX_BODY_BYTES` (413).
    TooLarge { limit: usize },
    /// Not all there within `BODY_READ_TIMEOUT_MS` (408).
    TimedOut { after: Duration },
    /// The connection failed while it was read (400).
    Unreadable(String),
}

impl BodyError {
    pub fn status(&self) -> StatusCode {
        match self {
            BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::TimedOut { .. } => StatusCode::REQUEST_TIMEOUT,
            BodyError::Unreadable(_) => StatusCode::BAD_REQUEST,
        }
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::TooLarge { limit } => {
                write!(f, "request body exceeds MAX_BODY_BYTES ({limit} bytes)")
            }
            BodyError::TimedOut { after } => write!(
                f,
                "the request body did not arrive within {} ms (BODY_READ_TIMEOUT_MS)",
                after.as_millis()
            ),
            BodyError::Unreadable(e) => write!(f, "could not read the request body: {e}"),
        }
    }
}

/// Read the whole body within `limits`, refusing past the size whether or
/// not a `Content-Length` was sent (a body may come chunked).
pub async fn read<S, B>(body: S, length: Option<u64>, limits: Limits) -> Result<BytesMut, BodyError>
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    tokio::time::timeout(
        limits.body_read_timeout,
        read_all(body, length, limits.max_body_bytes),
    )
    .await
    .map_err(|_| BodyError::TimedOut {
        after: limits.body_read_timeout,
    })?
}

async fn read_all<S, B>(
    mut body: S,
    length: Option<u64>,
    limit: usize,
) -> Result<BytesMut, BodyError>
where
    S: Stream<Item = Result<B, warp::Error>> + Unpin,
    B: Buf,
{
    if length.is_some_and(|n| n > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let mut bytes = BytesMut::with_capacity(length.unwrap_or(4096).min(limit as u64) as usize);
    while let Some(chunk) = body.next().await {
        let mut chunk = chunk.map_err(|e| BodyError::Unreadable(e.to_string()))?;
        if bytes.len() + chunk.remaining() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            bytes.extend_from_slice(part);
            let n = part.len();
            chunk.advance(n);
        }
    }
    Ok(bytes)
}
