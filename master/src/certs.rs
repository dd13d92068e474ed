//! `master certs`: a private CA and the certificates a cluster's TLS needs,
//! so a site without a PKI of its own can turn TLS on in one command.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Directory to write into (created if missing): ca.pem and ca-key.pem
    /// (the CA), node.pem and node-key.pem (the store node's), with
    /// --client client.pem and client-key.pem, with --peer-host peer.pem
    /// and peer-key.pem.
    #[arg(long)]
    out: PathBuf,
    /// Host names and IP addresses the store node is reached by (what
    /// clients put in STORE_ADDR); the node's certificate names each.
    /// Repeat or separate with commas.
    #[arg(long = "host", required = true, value_delimiter = ',')]
    hosts: Vec<String>,
    /// Host names and IP addresses of the slave hosts: also make peer.pem
    /// and peer-key.pem, naming each, which slaves serve their caches to
    /// each other with (`slave --peer-tls-cert peer.pem --peer-tls-key
    /// peer-key.pem`). Repeat or separate with commas.
    #[arg(long = "peer-host", value_delimiter = ',')]
    peer_hosts: Vec<String>,
    /// Also make a client certificate, for nodes started with
    /// --tls-client-ca (mutual TLS).
    #[arg(long)]
    client: bool,
    /// Sign with the CA already in --out (its key, ca-key.pem) instead of
    /// making a new one, e.g. for a second node or more clients.
    #[arg(long)]
    reuse_ca: bool,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    // A certificate names its issuer by distinguished name and is checked
    // with the issuer's key: the same parameters and the CA's key stand
    // for the CA that `ca.pem` holds.
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "ftbag cluster CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_key =
        if args.reuse_ca { KeyPair::from_pem(&read(&args.out.join("ca-key.pem"))?).context("ca-key.pem")? } else { KeyPair::generate()? };
    let ca = ca_params.self_signed(&ca_key)?;
    if !args.reuse_ca {
        write(&args.out.join("ca.pem"), &ca.pem(), false)?;
        write(&args.out.join("ca-key.pem"), &ca_key.serialize_pem(), true)?;
    }
    let leaf = |names: Vec<String>, purpose: ExtendedKeyUsagePurpose, cn: &str| -> anyhow::Result<(String, String)> {
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![purpose];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate()?;
        Ok((params.signed_by(&key, &ca, &ca_key)?.pem(), key.serialize_pem()))
    };
    let (cert, key) = leaf(args.hosts.clone(), ExtendedKeyUsagePurpose::ServerAuth, "ftbag store node")?;
    write(&args.out.join("node.pem"), &cert, false)?;
    write(&args.out.join("node-key.pem"), &key, true)?;
    if args.client {
        let (cert, key) = leaf(vec!["ftbag-client".into()], ExtendedKeyUsagePurpose::ClientAuth, "ftbag client")?;
        write(&args.out.join("client.pem"), &cert, false)?;
        write(&args.out.join("client-key.pem"), &key, true)?;
    }
    if !args.peer_hosts.is_empty() {
        let (cert, key) = leaf(args.peer_hosts.clone(), ExtendedKeyUsagePurpose::ServerAuth, "ftbag slave peer")?;
        write(&args.out.join("peer.pem"), &cert, false)?;
        write(&args.out.join("peer-key.pem"), &key, true)?;
    }
    println!(
        "wrote certificates for {} to {}: serve with --tls-cert node.pem --tls-key node-key.pem; clients take --tls-ca ca.pem{}{}",
        args.hosts.join(", "),
        args.out.display(),
        if args.client { " --tls-cert client.pem --tls-key client-key.pem (node: --tls-client-ca ca.pem)" } else { "" },
        if args.peer_hosts.is_empty() { "" } else { "; slaves serve peers with --peer-tls-cert peer.pem --peer-tls-key peer-key.pem" }
    );
    Ok(())
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Keys are readable by their owner only.
fn write(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if secret { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    std::io::Write::write_all(&mut f, text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}
