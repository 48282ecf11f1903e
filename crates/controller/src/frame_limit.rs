//! A bound on what one response of a remote apiserver can make the controller hold.
//!
//! kube reads a whole list response into memory before decoding it, and a watch
//! response line by line with no limit on a line's length: a remote that sends a 2 GB
//! list body, or a watch line that never ends, grows the process until it is killed,
//! and every link with it. A list response is one JSON line and a watch event one line,
//! so this layer, on each link's client, fails a response body as soon as it carries
//! more than `max` bytes without a newline. The error reaches the watch as any failed
//! read (kube retries with backoff) and the link reports it once (watches.rs).

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tower_layer::Layer;
use tower_service::Service;

/// The default of `--max-remote-response-bytes`: 16 MiB. An apiserver's list page of
/// 500 Services is about 1 MB; one object may be at most 1.5 MiB in etcd (3 MiB
/// requests), so 16 MiB passes anything a real apiserver sends and bounds what a
/// hostile one makes a link hold to 16 MiB plus what its decoder makes of it.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 16 << 20;

/// The text every frame-limit error carries (how watches.rs recognises it through
/// kube's error wrappers, which keep the text but not always the type).
pub const FRAME_TOO_LARGE: &str = "remote response frame over the limit";

/// A response body that carried more than the limit without a newline.
#[derive(Debug, thiserror::Error)]
#[error("{FRAME_TOO_LARGE} of {max} bytes without a newline (--max-remote-response-bytes)")]
pub struct FrameTooLarge {
    /// The limit, in bytes.
    pub max: usize,
}

/// Whether `e` or an error it wraps is a [`FrameTooLarge`] (by its text: kube wraps a
/// body error in `io::Error`, whose `source` skips the wrapped error).
pub fn is_frame_too_large(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.to_string().contains(FRAME_TOO_LARGE) {
            return true;
        }
        next = e.source();
    }
    false
}

/// The layer: every response body it passes is a [`Limited`] of `max` bytes a line.
#[derive(Clone, Copy, Debug)]
pub struct FrameLimitLayer {
    max: usize,
}

impl FrameLimitLayer {
    /// At most `max` bytes between two newlines of a response body (0: no limit).
    pub fn new(max: usize) -> Self {
        Self { max }
    }
}

impl<S> Layer<S> for FrameLimitLayer {
    type Service = FrameLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FrameLimit {
            inner,
            max: self.max,
        }
    }
}

/// The service of [`FrameLimitLayer`].
#[derive(Clone, Debug)]
pub struct FrameLimit<S> {
    inner: S,
    max: usize,
}

impl<S, B, RB> Service<http::Request<B>> for FrameLimit<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Limited<RB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let future = self.inner.call(req);
        let max = self.max;
        Box::pin(async move {
            let response = future.await?;
            Ok(response.map(|inner| Limited {
                inner,
                max,
                run: 0,
                failed: false,
            }))
        })
    }
}

/// A response body that fails once it carries more than `max` bytes without a newline.
#[derive(Debug)]
pub struct Limited<B> {
    inner: B,
    max: usize,
    /// Bytes since the last newline.
    run: usize,
    failed: bool,
}

impl<B> Limited<B> {
    /// Counts `data`; false when the run without a newline passed the limit.
    fn count(&mut self, data: &[u8]) -> bool {
        // The first line of a chunk goes on with the last one of the chunk before.
        let mut longest = 0;
        for (i, line) in data.split(|b| *b == b'\n').enumerate() {
            self.run = match i {
                0 => self.run.saturating_add(line.len()),
                _ => line.len(),
            };
            longest = longest.max(self.run);
        }
        self.max == 0 || longest <= self.max
    }
}

impl<B> Body for Limited<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.failed {
            return Poll::Ready(None);
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref()
            && !self.count(data)
        {
            // Further polls end the body: the error is said once.
            self.failed = true;
            let max = self.max;
            return Poll::Ready(Some(Err(Box::new(FrameTooLarge { max }))));
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};

    fn body(chunks: Vec<&'static [u8]>) -> impl Body<Data = Bytes, Error = std::io::Error> + Unpin {
        StreamBody::new(futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Frame::data(Bytes::from_static(c)))),
        ))
    }

    fn limited<B>(inner: B, max: usize) -> Limited<B> {
        Limited {
            inner,
            max,
            run: 0,
            failed: false,
        }
    }

    #[tokio::test]
    async fn lines_up_to_the_limit_pass_whole_across_chunks() {
        let b = limited(body(vec![b"abcd", b"ef\nabc", b"def\n", b"abcdef"]), 6);
        let got = b.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"abcdef\nabcdef\nabcdef");
    }

    #[tokio::test]
    async fn a_run_without_a_newline_over_the_limit_fails_the_body_once() {
        for chunks in [
            vec![&b"abcd"[..], b"efg"],
            vec![b"ab\nabcdefg\nab"],
            vec![b"ab\nabcd", b"efg\n"],
        ] {
            let mut b = limited(body(chunks.clone()), 6);
            let mut err = None;
            while let Some(frame) = b.frame().await {
                if let Err(e) = frame {
                    err = Some(e);
                }
            }
            let err = err.unwrap_or_else(|| panic!("{chunks:?} passed"));
            assert!(is_frame_too_large(err.as_ref()), "{err}");
            assert!(b.frame().await.is_none(), "ended after the error");
        }
    }

    #[tokio::test]
    async fn kube_s_wrappers_keep_the_error_recognisable() {
        let e = kube::Error::Service(Box::new(FrameTooLarge { max: 6 }));
        let read = kube::Error::ReadEvents(std::io::Error::other(e));
        let watch = kube::runtime::watcher::Error::WatchFailed(read);
        assert!(is_frame_too_large(&watch), "{watch}");
        let other = kube::Error::ReadEvents(std::io::Error::other("reset"));
        assert!(!is_frame_too_large(&other));
    }
}
