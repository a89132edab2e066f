//! The HTTP endpoint Prometheus scrapes: `GET /metrics`, bounded in connections served at
//! once, in the time a request's head may take to arrive and in a connection's lifetime.

use bytes_body::full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The content type of `prometheus_client`'s text (OpenMetrics 1.0).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Where and how the endpoint listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct EndpointConfig {
    /// Address to serve `/metrics` on (`HOST:PORT`; port 0 picks a free one).
    pub listen: String,
    /// Scrape connections served at once; more are closed on accept.
    pub connections_max: usize,
    /// A request's head must arrive within this long.
    pub request_timeout_ms: u64,
    /// A connection is closed this long after it was accepted (keep-alive scrapers reconnect).
    pub connection_ms_max: u64,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        EndpointConfig {
            listen: "127.0.0.1:0".to_string(),
            connections_max: 16,
            request_timeout_ms: 5_000,
            connection_ms_max: 300_000,
        }
    }
}

impl EndpointConfig {
    /// The defaults, listening on `listen`.
    pub fn on(listen: &str) -> EndpointConfig {
        EndpointConfig { listen: listen.to_string(), ..EndpointConfig::default() }
    }
}

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetricsError {
    #[error("listen for metrics scrapes on {listen}: {source}")]
    Bind { listen: String, source: std::io::Error },
}

/// A running endpoint; stops when dropped.
#[derive(Debug)]
pub struct MetricsHandle {
    local_addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for MetricsHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `config.listen` and serves `registry` on it (on the current tokio runtime).
pub async fn bind(config: &EndpointConfig, registry: Arc<Registry>) -> Result<MetricsHandle, MetricsError> {
    let bind_error = |source| MetricsError::Bind { listen: config.listen.clone(), source };
    let listener = TcpListener::bind(&config.listen).await.map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    let task = tokio::spawn(accept_loop(listener, registry, config.clone()));
    tracing::info!(%local_addr, "serving metrics on /metrics");
    Ok(MetricsHandle { local_addr, task })
}

async fn accept_loop(listener: TcpListener, registry: Arc<Registry>, config: EndpointConfig) {
    let slots = Arc::new(Semaphore::new(config.connections_max.max(1)));
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "refusing a metrics connection: connections_max reached");
            continue;
        };
        let registry = registry.clone();
        let config = config.clone();
        tokio::spawn(async move {
            serve_connection(stream, registry, &config).await;
            drop(slot);
        });
    }
}

async fn serve_connection(stream: tokio::net::TcpStream, registry: Arc<Registry>, config: &EndpointConfig) {
    let service = hyper::service::service_fn(move |request| {
        let registry = registry.clone();
        async move { Ok::<_, std::convert::Infallible>(respond(&request, &registry)) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(config.request_timeout_ms.max(1)));
    let connection = http.serve_connection(TokioIo::new(stream), service);
    let lifetime = Duration::from_millis(config.connection_ms_max.max(1));
    let _ = tokio::time::timeout(lifetime, connection).await;
}

/// The reply to one request: the metrics for `GET /metrics`, else 404 or 405.
fn respond(
    request: &Request<Incoming>,
    registry: &Registry,
) -> Response<http_body_util::Full<hyper::body::Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => (StatusCode::OK, CONTENT_TYPE, crate::render(registry)),
        (_, "/metrics") => (StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n".to_string()),
        _ => (StatusCode::NOT_FOUND, "text/plain", "metrics are at /metrics\n".to_string()),
    };
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

mod bytes_body {
    pub fn full(text: String) -> http_body_util::Full<hyper::body::Bytes> {
        http_body_util::Full::new(hyper::body::Bytes::from(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut reply = String::new();
        let _ = stream.read_to_string(&mut reply).await;
        reply
    }

    fn endpoint_config() -> EndpointConfig {
        EndpointConfig { connections_max: 1, request_timeout_ms: 300, ..EndpointConfig::default() }
    }

    #[tokio::test]
    async fn serves_metrics_and_refuses_other_paths_and_methods() {
        let handle = bind(&endpoint_config(), Arc::new(Registry::with_prefix("flotilla"))).await.unwrap();
        let addr = handle.local_addr();
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200") && ok.contains("# EOF"), "{ok}");
        let missing = get(addr, "GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let post =
            get(addr, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_and_connections_are_bounded() {
        let handle = bind(&endpoint_config(), Arc::new(Registry::default())).await.unwrap();
        let addr = handle.local_addr();
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The only slot is taken by the silent connection: a second one is closed at once.
        let mut refused = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), refused.read(&mut byte)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "over connections_max is closed: {read:?}");
        // The silent one sends no request head within request_timeout_ms and is closed.
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut rest)).await;
        assert!(closed.is_ok(), "a connection without a request is closed");
        // Its slot is given back just after the close: retry briefly.
        let mut ok = String::new();
        for _ in 0..50 {
            ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
            if ok.starts_with("HTTP/1.1 200") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(ok.starts_with("HTTP/1.1 200"), "its slot is free again: {ok}");
    }
}
