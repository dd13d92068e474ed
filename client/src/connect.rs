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
    /// Reaches the object store of a node whose block versions are
    /// objects ([`crate::objects`]), so that payloads go between this
    /// client and the object store and not through the node. `None`:
    /// such a node's blocks go through the node.
    pub objects: Option<crate::objects::ObjectsConnector>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions { token: None, tls: None, local: true, blocks: BlocksOver::DataPlane, objects: None }
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
        Ok(ConnectOptions { token: self.token.clone(), tls, local: !self.no_local, blocks: self.blocks_over, objects: None })
    }
}

#[cfg(feature = "cli")]
/// The settings file clients read before their flags and environment:
/// `$FTBAG_CONFIG`, else `$XDG_CONFIG_HOME/ftbag/config.toml`, else
/// `~/.config/ftbag/config.toml`.
pub fn config_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FTBAG_CONFIG") {
        return Some(p.into());
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("ftbag").join("config.toml"))
}

#[cfg(feature = "cli")]
/// The keys a settings file may hold, and the variable each stands for.
const CONFIG_KEYS: [(&str, &str); 7] = [
    ("store", "STORE_ADDR"),
    ("token", "STORE_TOKEN"),
    ("tls_ca", "STORE_TLS_CA"),
    ("tls_cert", "STORE_TLS_CERT"),
    ("tls_key", "STORE_TLS_KEY"),
    ("no_local", "STORE_NO_LOCAL"),
    ("blocks_over", "STORE_BLOCKS_OVER"),
];

#[cfg(feature = "cli")]
/// Reads the settings file ([`config_path`]), if there is one, into the
/// environment variables the connection flags read, each only where the
/// environment does not set it: flags override the environment, which
/// overrides the file. Call first in `main`, before any thread starts.
///
/// ```toml
/// store = "storehost:7070"
/// token = "..."
/// tls_ca = "/etc/ftbag/ca.pem"
/// ```
pub fn load_config_file() -> Result<Option<PathBuf>, StoreError> {
    let Some(path) = config_path() else { return Ok(None) };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::InvalidArgument { what: format!("settings file {}: {e}", path.display()) }),
    };
    let bad = |why: String| StoreError::InvalidArgument { what: format!("settings file {}: {why}", path.display()) };
    for (key, var) in apply_config(&text).map_err(bad)? {
        if std::env::var_os(var).is_none() {
            std::env::set_var(var, key);
        }
    }
    Ok(Some(path))
}

#[cfg(feature = "cli")]
/// The (value, variable) pairs a settings file sets; unknown keys and
/// values of the wrong type are errors.
fn apply_config(text: &str) -> Result<Vec<(String, &'static str)>, String> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| e.to_string())?;
    let mut out = Vec::new();
    for (key, value) in table {
        let Some(&(_, var)) = CONFIG_KEYS.iter().find(|(k, _)| *k == key) else {
            let known: Vec<&str> = CONFIG_KEYS.iter().map(|(k, _)| *k).collect();
            return Err(format!("unknown key {key:?} (known: {})", known.join(", ")));
        };
        let value = match value {
            toml::Value::String(s) => s,
            toml::Value::Boolean(b) => b.to_string(),
            other => return Err(format!("{key} must be a string, not {}", other.type_str())),
        };
        out.push((value, var));
    }
    Ok(out)
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

    #[cfg(feature = "cli")]
    #[test]
    fn a_settings_file_names_the_variables_it_stands_for_and_refuses_unknown_keys() {
        let got = apply_config("store = \"h:7070\"\ntoken = \"t\"\nno_local = true\n").unwrap();
        assert!(got.contains(&("h:7070".into(), "STORE_ADDR")) && got.contains(&("true".into(), "STORE_NO_LOCAL")), "{got:?}");
        assert!(apply_config("stor = \"h:1\"").unwrap_err().contains("unknown key"));
        assert!(apply_config("store = 7").unwrap_err().contains("must be a string"));
    }
}
