//! `master node`: the store node's connections by transport, so an
//! operator can see whether clients took the network path or, on the
//! node's own host, its Unix sockets.

use crate::store_args::StoreArgs;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    store: StoreArgs,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<()> {
    let client = args.store.connect().await?;
    let s = client.node_stats().await?;
    if args.json {
        let v = serde_json::json!({
            "address": client.addr(),
            "tls": s.tls,
            "tcp_sessions": s.tcp_sessions,
            "unix_sessions": s.unix_sessions,
            "data_tcp_connections": s.data_tcp_connections,
            "data_unix_connections": s.data_unix_connections,
            "refused_connections": s.refused_connections,
        });
        println!("{v}");
        return Ok(());
    }
    println!("store node at {} ({})", client.addr(), if s.tls { "TLS" } else { "plaintext" });
    println!("sessions opened:        {} over TCP, {} from its own process", s.tcp_sessions, s.unix_sessions);
    println!("data-plane connections: {} over TCP, {} over its Unix socket", s.data_tcp_connections, s.data_unix_connections);
    println!("connections refused:    {} (bad token, hello or TLS handshake)", s.refused_connections);
    Ok(())
}
