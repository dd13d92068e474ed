//! Reaching a node: the gRPC channel's settings and token, the first call
//! and what its failures mean, and the data plane the node describes.

use super::*;

/// The settings every channel to a node has, TCP or Unix.
pub(super) fn configure(endpoint: Endpoint) -> Endpoint {
    endpoint
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(2))
        .initial_stream_window_size(8 << 20)
        .initial_connection_window_size(32 << 20)
        .http2_keep_alive_interval(Duration::from_millis(1000))
        .keep_alive_timeout(Duration::from_secs(3))
}

pub(super) fn rpc_over(channel: Channel, auth: Auth) -> Rpc {
    StoreClient::with_interceptor(channel, auth).max_decoding_message_size(MAX_MESSAGE_BYTES).max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// Where the node's data plane and Unix sockets are; `None` from a node
/// without a data plane.
pub(super) async fn data_plane_info(rpc: &Rpc) -> Result<Option<proto::DataPlaneInfo>> {
    match rpc.clone().data_plane(proto::Empty {}).await {
        Ok(r) => Ok(Some(r.into_inner()).filter(|info| info.port != 0)),
        Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
        Err(s) => Err(s.into()),
    }
}

/// `host:port` split; a bare host is refused by name rather than left to
/// the transport's "invalid URI".
pub(super) fn split_host_port(addr: &str) -> Result<(&str, u16)> {
    let bad = |why: &str| StoreError::InvalidArgument { what: format!("store address {addr:?} {why} (host:port, e.g. storehost:7070)") };
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
    if host.is_empty() || (host.contains(':') && !host.starts_with('[')) {
        return Err(bad("is not host:port"));
    }
    let port = port.parse().map_err(|_| bad("has no valid port"))?;
    Ok((host, port))
}

/// An error's text with its sources, each said once (transport errors
/// often repeat their source's text in their own).
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out = format!("{out}: {text}");
        }
        source = s.source();
    }
    out
}

/// Why the first connection to `addr` failed, in words a user can act on.
pub(super) fn connect_failed(addr: &str, options: &ConnectOptions, e: &tonic::transport::Error) -> StoreError {
    let chain = error_chain(e);
    let lower = chain.to_lowercase();
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    if lower.contains("certificate") || lower.contains("unknownissuer") || lower.contains("notvalidforname") {
        return StoreError::Unauthenticated {
            what: format!("TLS to {addr}: the node's certificate is not trusted by --tls-ca, or does not name {host} ({chain})"),
        };
    }
    let what = if lower.contains("dns error") || lower.contains("failed to lookup") || lower.contains("name or service not known") {
        format!("cannot resolve the store node's host {host:?} ({chain})")
    } else if lower.contains("connection refused") {
        format!("nothing listens at {addr} (connection refused): is `master serve` running there, on that port?")
    } else if lower.contains("timed out") || lower.contains("deadline") {
        format!("no answer from {addr} (host down, or a firewall drops the port): {chain}")
    } else if options.tls.is_some() && (lower.contains("tls") || lower.contains("handshake") || lower.contains("corrupt message")) {
        format!("TLS handshake with {addr} failed (does the node serve TLS, and may this client present its certificate?): {chain}")
    } else {
        format!("cannot connect to the store node at {addr}: {chain}")
    };
    StoreError::StoreUnavailable { what }
}

/// The first call on a fresh connection failed: typed errors stand; a
/// connection the node dropped at once says what may be wrong.
pub(super) fn first_call_failed(addr: &str, options: &ConnectOptions, e: StoreError) -> StoreError {
    match e {
        StoreError::StoreUnavailable { what } if options.tls.is_none() => StoreError::StoreUnavailable {
            what: format!("{addr} answered the first call with a transport failure ({what}); if the node serves TLS, give --tls-ca (STORE_TLS_CA)"),
        },
        StoreError::StoreUnavailable { what } => StoreError::StoreUnavailable {
            what: format!("{addr} answered the first call with a transport failure ({what}); if the node requires client certificates, give --tls-cert and --tls-key"),
        },
        e => e,
    }
}

/// The node's service over its Unix socket, for a client on its host;
/// used only when the node answers there with the id it gave over TCP.
/// The `authorization` value that carries `token`.
pub(super) fn bearer(token: Option<&str>) -> Result<Option<MetadataValue<Ascii>>> {
    token
        .map(|t| format!("Bearer {t}").parse().map_err(|_| StoreError::InvalidArgument { what: "token is not printable ASCII".into() }))
        .transpose()
}

/// Opens the data plane `info` describes: its Unix socket on the node's
/// own host (decided by identity, never by address: the host's boot id and
/// network namespace; and the socket must answer with the node's id),
/// else its TCP port on the host of `addr`.
pub(super) async fn connect_data_plane(
    info: &proto::DataPlaneInfo,
    addr: &str,
    options: &ConnectOptions,
) -> Result<Option<Arc<DataPlane>>> {
    let token = options.token.as_deref();
    let same_host = !info.host_id.is_empty() && info.host_id == host_identity();
    let node = Uuid::from_slice(&info.node_id).ok();
    // A node whose blocks are objects has no version files to hand over.
    let objects = !info.object_pool.is_empty();
    if options.local && same_host && !objects && !info.unix_path.is_empty() && node.is_some() {
        match DataPlane::connect(Target::Unix(info.unix_path.clone().into()), token, None, node).await {
            Ok(plane) => return Ok(Some(Arc::new(plane))),
            Err(e @ StoreError::Unauthenticated { .. }) => return Err(e),
            // The node's host, but its socket is not reachable from here
            // (another mount namespace, say), or is another node's.
            Err(e) => tracing::debug!("no local data plane ({e}); blocks go over TCP"),
        }
    }
    let (host, _) = split_host_port(addr)?;
    let port = info.port;
    let unreachable = |e: std::io::Error| StoreError::StoreUnavailable { what: format!("block data plane at {host}:{port}: {e}") };
    let plane_addr = tokio::net::lookup_host(format!("{host}:{port}"))
        .await
        .map_err(unreachable)?
        .next()
        .ok_or_else(|| unreachable(std::io::Error::other("no address")))?;
    let tls = match &options.tls {
        Some(tls) => Some((tls.connector(), ClientTls::server_name(host)?)),
        None => None,
    };
    let plane = DataPlane::connect(Target::Tcp(plane_addr), token, tls, None).await?;
    if objects {
        plane.attach_objects(options.objects.as_ref().map(|c| c.open(&info.object_pool, &info.object_prefix)).transpose()?);
    }
    Ok(Some(Arc::new(plane)))
}
