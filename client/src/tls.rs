//! TLS between hosts, both ends: a client trusts one CA (`--tls-ca`) and
//! may present a certificate of its own (mutual TLS); a node presents its
//! certificate (`--tls-cert`, `--tls-key`) and may require clients'
//! certificates signed by a CA it names. One rustls configuration serves
//! gRPC (through tonic's TLS) and the block data plane (tokio-rustls), so
//! both ports check the same certificates.
//!
//! The cluster token is still required over TLS: TLS says who the node is
//! and keeps the traffic private; the token (or a client certificate) says
//! who may use it.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::StoreError;

type Result<T> = std::result::Result<T, StoreError>;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn bad(what: impl std::fmt::Display) -> StoreError {
    StoreError::InvalidArgument { what: format!("TLS: {what}") }
}

fn read(path: &Path, flag: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| bad(format!("{flag} {}: {e}", path.display())))
}

fn certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs =
        rustls_pemfile::certs(&mut &pem[..]).collect::<std::result::Result<Vec<_>, _>>().map_err(|e| bad(format!("{what}: {e}")))?;
    if certs.is_empty() {
        return Err(bad(format!("{what}: no PEM certificate in it")));
    }
    Ok(certs)
}

fn key(pem: &[u8], what: &str) -> Result<PrivateKeyDer<'static>> {
    rustls_pemfile::private_key(&mut &pem[..])
        .map_err(|e| bad(format!("{what}: {e}")))?
        .ok_or_else(|| bad(format!("{what}: no PEM private key in it")))
}

fn roots(ca: &[u8], what: &str) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for c in certs(ca, what)? {
        roots.add(c).map_err(|e| bad(format!("{what}: {e}")))?;
    }
    Ok(roots)
}

/// A client's TLS: the CA it trusts the node's certificate by, and its own
/// certificate where the node asks for one.
#[derive(Clone)]
pub struct ClientTls {
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("mutual", &self.identity.is_some()).finish()
    }
}

impl ClientTls {
    /// `ca`: PEM certificates to trust; `identity`: PEM certificate chain
    /// and private key to present (mutual TLS).
    pub fn from_pem(ca: &[u8], identity: Option<(&[u8], &[u8])>) -> Result<ClientTls> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(bad)?
            .with_root_certificates(roots(ca, "--tls-ca")?);
        let config = match identity {
            Some((cert, k)) => builder.with_client_auth_cert(certs(cert, "--tls-cert")?, key(k, "--tls-key")?).map_err(bad)?,
            None => builder.with_no_client_auth(),
        };
        Ok(ClientTls { ca: ca.to_vec(), identity: identity.map(|(c, k)| (c.to_vec(), k.to_vec())), config: Arc::new(config) })
    }

    /// [`ClientTls::from_pem`] of files.
    pub fn from_files(ca: &Path, cert: Option<&Path>, key: Option<&Path>) -> Result<ClientTls> {
        let ca = read(ca, "--tls-ca")?;
        match (cert, key) {
            (Some(c), Some(k)) => Self::from_pem(&ca, Some((&read(c, "--tls-cert")?, &read(k, "--tls-key")?))),
            (None, None) => Self::from_pem(&ca, None),
            _ => Err(bad("a client certificate needs both --tls-cert and --tls-key")),
        }
    }

    /// tonic's configuration for a node reached as `host` (a name or an
    /// IP address, which its certificate must name).
    pub(crate) fn grpc(&self, host: &str) -> tonic::transport::ClientTlsConfig {
        let c = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca))
            .domain_name(host.trim_matches(['[', ']']));
        match &self.identity {
            Some((cert, key)) => c.identity(tonic::transport::Identity::from_pem(cert, key)),
            None => c,
        }
    }

    pub(crate) fn connector(&self) -> TlsConnector {
        TlsConnector::from(self.config.clone())
    }

    pub(crate) fn server_name(host: &str) -> Result<ServerName<'static>> {
        ServerName::try_from(host.trim_matches(['[', ']']).to_owned()).map_err(|e| bad(format!("{host:?} cannot name a TLS server: {e}")))
    }
}

/// A node's TLS: its certificate and key, and the CA whose certificates
/// clients must present (`None`: no client certificates asked for).
#[derive(Clone)]
pub struct ServerTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
    config: Arc<ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("mutual", &self.client_ca.is_some()).finish()
    }
}

impl ServerTls {
    pub fn from_pem(cert: &[u8], k: &[u8], client_ca: Option<&[u8]>) -> Result<ServerTls> {
        let builder = ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions().map_err(bad)?;
        let builder = match client_ca {
            Some(ca) => builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca, "--tls-client-ca")?), provider()).build().map_err(bad)?,
            ),
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_single_cert(certs(cert, "--tls-cert")?, key(k, "--tls-key")?).map_err(bad)?;
        // gRPC clients insist on HTTP/2 by ALPN; data-plane clients offer
        // no protocol, which rustls accepts.
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(ServerTls { cert: cert.to_vec(), key: k.to_vec(), client_ca: client_ca.map(<[u8]>::to_vec), config: Arc::new(config) })
    }

    /// [`ServerTls::from_pem`] of files.
    pub fn from_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<ServerTls> {
        let client_ca = client_ca.map(|p| read(p, "--tls-client-ca")).transpose()?;
        Self::from_pem(&read(cert, "--tls-cert")?, &read(key, "--tls-key")?, client_ca.as_deref())
    }

    /// tonic's configuration for the gRPC port.
    pub fn grpc(&self) -> tonic::transport::ServerTlsConfig {
        let c = tonic::transport::ServerTlsConfig::new().identity(tonic::transport::Identity::from_pem(&self.cert, &self.key));
        match &self.client_ca {
            Some(ca) => c.client_ca_root(tonic::transport::Certificate::from_pem(ca)),
            None => c,
        }
    }

    /// The data plane's acceptor.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.config.clone())
    }

    /// An acceptor for an HTTP/1.1 port (the dashboard's): the same
    /// certificate and client certificates, offering `http/1.1` by ALPN
    /// where the gRPC port offers only `h2`.
    pub fn https_acceptor(&self) -> TlsAcceptor {
        let mut config = (*self.config).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }

    /// Whether clients must present a certificate.
    pub fn is_mutual(&self) -> bool {
        self.client_ca.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_hold_no_certificate_or_key_are_refused_by_flag() {
        let e = ClientTls::from_pem(b"not a pem", None).unwrap_err();
        assert!(e.to_string().contains("--tls-ca"), "{e}");
        let e = ServerTls::from_pem(b"", b"", None).unwrap_err();
        assert!(e.to_string().contains("--tls-cert"), "{e}");
    }
}
