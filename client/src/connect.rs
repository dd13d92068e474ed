//! How a client reaches a node: token, TLS, whether it may take the node's
//! Unix sockets, and whether blocks go over the data plane or gRPC.

#[cfg(feature = "cli")]
use std::path::PathBuf;

use crate::tls::ClientTls;
#[cfg(feature = "cli")]
use crate::StoreError;

/// Everything [`crate::Client::connect_with`] is told besides the address.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// The cluster token, if the node requires one.
    pub token: Option<String>,
    /// TLS to the node's gRPC and data-plane ports; `None`: plaintext.
    pub tls: Option<ClientTls>,
    /// Whether a client on the node's own host (same machine and network
    /// namespace, see [`host_identity`]) uses the node's Unix sockets.
    /// Off, it takes the network path like a client on another host.
    pub local: bool,
    pub blocks: BlocksOver,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions { token: None, tls: None, local: true, blocks: BlocksOver::DataPlane }
    }
}

impl ConnectOptions {
    pub fn with_token(token: Option<&str>) -> ConnectOptions {
        ConnectOptions { token: token.map(str::to_owned), ..ConnectOptions::default() }
    }
}

/// Which way block payloads travel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum BlocksOver {
    /// The node's block data plane (its own TCP port, or its Unix socket on
    /// its host): the fast path.
    #[default]
    DataPlane,
    /// gRPC streams on the gRPC port: for a site whose firewall lets only
    /// that port through.
    Grpc,
}

/// This process's host as the node compares it: the machine's boot id and
/// the network namespace. Two processes with the same one can reach each
/// other's Unix sockets and share a network stack; network-namespace hosts
/// on one machine share the filesystem but not the identity, so they take
/// the network path as separate machines do.
pub fn host_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let netns = std::fs::read_link("/proc/self/ns/net").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    if boot.trim().is_empty() || netns.is_empty() {
        // Unknown: never equal to a node's, so never local.
        return String::new();
    }
    format!("{}/{netns}", boot.trim())
}

/// The connection flags every client binary takes (`--store`, `--token`,
/// TLS, the network path), each with its environment variable.
#[cfg(feature = "cli")]
#[derive(clap::Args, Clone, Debug)]
pub struct ConnectArgs {
    /// Address of the store node (host:port).
    #[arg(long, env = "STORE_ADDR", default_value = crate::DEFAULT_STORE_ADDR)]
    pub store: String,
    /// Shared cluster token, if the store node requires one.
    #[arg(long, env = "STORE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM file of the CA that signed the node's certificate: connect with
    /// TLS, trusting that CA only. Without it the connection is plaintext.
    #[arg(long, env = "STORE_TLS_CA", value_name = "PEM")]
    pub tls_ca: Option<PathBuf>,
    /// PEM certificate to present to a node that asks for client
    /// certificates (mutual TLS); needs --tls-key and --tls-ca.
    #[arg(long, env = "STORE_TLS_CERT", value_name = "PEM", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert.
    #[arg(long, env = "STORE_TLS_KEY", value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Take the network path even on the node's own host (no Unix sockets).
    #[arg(long, env = "STORE_NO_LOCAL")]
    pub no_local: bool,
    /// Which way blocks travel: `data-plane` (the node's block port) or
    /// `grpc` (only the gRPC port, for firewalls that let nothing else
    /// through; slower).
    #[arg(long, env = "STORE_BLOCKS_OVER", value_enum, default_value_t = BlocksOver::DataPlane)]
    pub blocks_over: BlocksOver,
}

#[cfg(feature = "cli")]
impl ConnectArgs {
    /// The options these flags say; fails on an unreadable TLS file.
    pub fn options(&self) -> Result<ConnectOptions, StoreError> {
        let tls = match &self.tls_ca {
            Some(ca) => Some(ClientTls::from_files(ca, self.tls_cert.as_deref(), self.tls_key.as_deref())?),
            None => None,
        };
        Ok(ConnectOptions { token: self.token.clone(), tls, local: !self.no_local, blocks: self.blocks_over })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_host_identity_naming_its_network_namespace() {
        let id = host_identity();
        assert!(id.contains("net:["), "{id}");
        assert_eq!(id, host_identity());
    }
}
