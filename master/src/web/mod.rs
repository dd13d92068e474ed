//! `master serve --http ADDR`: a live dashboard (`/`) and Prometheus
//! metrics (`/metrics`) served by the store node's own process.
//!
//! The figures are what `master status`, `master slaves` and `master node`
//! read, read the same way (`collect.rs` calls `jobs::job_status`) over
//! the node's gRPC Unix socket, once a second; every request answers from
//! that one read. The page is one HTML file with its script and style
//! inlined (`assets/`, compiled in), and polls `/api/snapshot`.
//!
//! **Auth:** the cluster token of the node's other ports (`auth.rs`), and
//! its TLS: where the node serves TLS the HTTP port serves it too, with the
//! same certificate, and where the node requires client certificates
//! (`--tls-client-ca`) so does this port.

mod auth;
mod collect;
mod prom;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::sync::watch;

use collect::{Collector, Snapshot};

/// What the HTTP port serves with: the node's own token and TLS.
pub(crate) struct Options {
    pub(crate) listen: SocketAddr,
    pub(crate) token: Option<String>,
    pub(crate) tls: Option<store_client::ServerTls>,
}

#[derive(Clone)]
struct Shared {
    token: Option<Arc<str>>,
    latest: watch::Receiver<Arc<Snapshot>>,
}

/// A handshake that has not finished by then is dropped (a client that
/// connects and says nothing must not hold a task for ever).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds the port and serves it in the background, reading the node
/// through `client` once a second; returns the bound address.
pub(crate) async fn start(options: Options, client: store_client::Client) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(options.listen).await.with_context(|| format!("binding --http {}", options.listen))?;
    let addr = listener.local_addr()?;
    let mut collector = Collector::new(client, options.tls.is_some());
    // One read before the port answers: no request sees an empty snapshot.
    let first = collector.next(&Snapshot::default()).await;
    let (tx, rx) = watch::channel(Arc::new(first));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + collect::PERIOD, collect::PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let previous = tx.borrow().clone();
            let next = collector.next(&previous).await;
            if tx.send(Arc::new(next)).is_err() {
                return;
            }
        }
    });
    let shared = Shared { token: options.token.map(Arc::from), latest: rx };
    let app = Router::new()
        .route("/", get(index))
        .route("/api/snapshot", get(snapshot))
        .route("/metrics", get(metrics))
        // Before the layer, so that unknown paths ask for the token too.
        .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "no such page: / is the dashboard, /metrics the metrics\n") })
        .layer(axum::middleware::from_fn_with_state(shared.clone(), auth::require_token))
        .with_state(shared);
    let acceptor = options.tls.as_ref().map(store_client::ServerTls::https_acceptor);
    tokio::spawn(serve(listener, app, acceptor));
    Ok(addr)
}

/// Accepts connections for ever: HTTP/1.1, over TLS when the node has it.
async fn serve(listener: tokio::net::TcpListener, app: Router, tls: Option<tokio_rustls::TlsAcceptor>) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin.
                tracing::warn!("dashboard accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let (app, tls) = (app.clone(), tls.clone());
        tokio::spawn(async move {
            let service = hyper_util::service::TowerToHyperService::new(app);
            let http = hyper::server::conn::http1::Builder::new();
            let served = match tls {
                Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                    Ok(Ok(stream)) => http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await,
                    Ok(Err(e)) => {
                        tracing::debug!("dashboard TLS handshake from {peer} failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!("dashboard TLS handshake from {peer} timed out");
                        return;
                    }
                },
                None => http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service).await,
            };
            if let Err(e) = served {
                tracing::debug!("dashboard connection from {peer}: {e}");
            }
        });
    }
}

/// The page: HTML with its style and script inlined, so that the one
/// request that carries `?token=` is the only one without the header.
fn page() -> &'static str {
    static PAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PAGE.get_or_init(|| {
        include_str!("assets/index.html")
            .replace("/*STYLE*/", include_str!("assets/style.css"))
            .replace("/*SCRIPT*/", include_str!("assets/app.js"))
    })
}

async fn index() -> Response {
    ([(header::CACHE_CONTROL, "no-store")], Html(page())).into_response()
}

async fn snapshot(State(shared): State<Shared>) -> Response {
    let s = shared.latest.borrow().clone();
    match serde_json::to_string(&*s) {
        Ok(body) => ([(header::CACHE_CONTROL, "no-store"), (header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn metrics(State(shared): State<Shared>) -> Response {
    let s = shared.latest.borrow().clone();
    ([(header::CONTENT_TYPE, prom::CONTENT_TYPE)], prom::render(s)).into_response()
}
