//! `master serve --http`: the dashboard in a real headless browser while a
//! job runs and a slave is killed, `/metrics` parsed as Prometheus's text
//! format with its counters checked against the job, and both refused
//! without the cluster token. Real processes: the node, slaves and
//! `master` commands as a user runs them; Chromium through chromedriver.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::web::{self, Browser};
use support::StoreProc;

const TOKEN: &str = "dash-token";

/// A node with a token and the dashboard on a port of its own; the
/// `master` and `slave` processes the test starts get the token from the
/// environment, as a user's do.
fn node(dir: &std::path::Path) -> (StoreProc, String) {
    node_with(dir, &[])
}

/// [`node`] with more `master serve` flags.
fn node_with(dir: &std::path::Path, extra: &[&str]) -> (StoreProc, String) {
    std::env::set_var("STORE_TOKEN", TOKEN);
    let data = dir.to_str().unwrap();
    StoreProc::spawn_with_http(
        Command::new(env!("CARGO_BIN_EXE_master"))
            .args(["serve", "--data", data, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--token", TOKEN])
            .args(extra),
    )
}

use support::{master_ok as master, slave};

/// Random n×n A and B in blocks of 64 and a submitted C = A·B: (job, tasks).
fn submit_matmul(store: &str, n: u64) -> (String, u64) {
    support::create_kind(store, "A", n, n, 64, "random", 1);
    support::create_kind(store, "B", n, n, 64, "random", 2);
    (master(store, &["submit", "matmul", "A", "B", "--out", "C"]), n.div_ceil(64).pow(2))
}

const BEARER: &str = "Bearer dash-token";

#[test]
fn dashboard_and_metrics_refuse_requests_without_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let (_node, http) = node(dir.path());
    for path in ["/", "/api/snapshot", "/metrics", "/nothing-here"] {
        let (status, body) = web::get(&http, path, &[]);
        assert_eq!(status, 401, "{path} without a token: {body}");
        assert!(body.contains("cluster token"), "the refusal says what is missing: {body}");
        assert_eq!(web::get(&http, path, &[("Authorization", "Bearer wrong")]).0, 401, "{path} with a wrong token");
        assert_eq!(web::get(&http, &format!("{path}?token=wrong"), &[]).0, 401, "{path} with a wrong ?token=");
    }
    let (status, page) = web::get(&http, &format!("/?token={TOKEN}"), &[]);
    assert_eq!(status, 200);
    assert!(page.contains("<title>ftbag dashboard</title>") && page.contains("Bearer "), "the page, its script inlined");
    assert_eq!(web::get(&http, "/api/snapshot", &[("Authorization", BEARER)]).0, 200);
    assert_eq!(web::get(&http, "/metrics", &[("Authorization", BEARER)]).0, 200);
}

/// One scrape of `/metrics`, parsed; every family has its HELP and TYPE.
fn scrape(http: &str) -> prometheus_parse::Scrape {
    let (status, text) = web::get(http, "/metrics", &[("Authorization", BEARER)]);
    assert_eq!(status, 200, "{text}");
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name = line.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_sum", "_count"].iter().fold(name, |n, s| n.strip_suffix(s).unwrap_or(n));
        assert!(text.contains(&format!("# TYPE {family} ")) || text.contains(&format!("# TYPE {name} ")), "no TYPE for {line:?}");
        assert!(name.starts_with("ftbag_"), "{name} is not in the ftbag_ namespace");
    }
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text format")
}

/// The value of `name` (with `label=value`, if given) in a scrape.
fn value(s: &prometheus_parse::Scrape, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    s.samples.iter().find(|x| x.metric == name && label.is_none_or(|(k, v)| x.labels.get(k) == Some(v))).map(|x| match &x.value {
        prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) => *v,
        other => panic!("{name} is not a single value: {other:?}"),
    })
}

#[test]
fn metrics_parse_and_count_a_jobs_tasks_as_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (node, http) = node(dir.path());
    let before = scrape(&http);
    assert_eq!(value(&before, "ftbag_store_up", None), Some(1.0));
    assert!(value(&before, "ftbag_disk_free_bytes", None).unwrap() > 0.0);
    let (job, n_tasks) = submit_matmul(&node.addr, 512);
    let slaves: Vec<_> = (0..2).map(|k| slave(&node.addr, &format!("m-{k}"), &[])).collect();
    let counters =
        ["ftbag_tasks_committed_total", "ftbag_commits_total", "ftbag_block_written_bytes_total", "ftbag_block_read_bytes_total"];
    let read = |s: &prometheus_parse::Scrape, name: &str| {
        let label = (name == "ftbag_tasks_committed_total").then_some(("app", "matmul"));
        value(s, name, label).unwrap_or(0.0)
    };
    let mut last: Vec<f64> = counters.iter().map(|c| read(&before, c)).collect();
    let mut seen_midway = false;
    let start = Instant::now();
    let end = loop {
        assert!(start.elapsed() < Duration::from_secs(240), "the job did not finish: {last:?} of {n_tasks}");
        let s = scrape(&http);
        let now: Vec<f64> = counters.iter().map(|c| read(&s, c)).collect();
        for (i, c) in counters.iter().enumerate() {
            assert!(now[i] >= last[i], "{c} went down: {} then {}", last[i], now[i]);
        }
        seen_midway |= now[0] > 0.0 && now[0] < n_tasks as f64;
        last = now;
        if last[0] == n_tasks as f64 {
            break s;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    master(&node.addr, &["wait", &job]);
    slaves.into_iter().for_each(support::kill_child);
    eprintln!("committed {n_tasks} tasks; counters moved {last:?}; seen midway: {seen_midway}");
    assert!(last[1] >= n_tasks as f64, "each task's commit counted: {last:?}");
    // Every task wrote its 64×64 block of C, and read a row of A's and a column of B's.
    assert!(last[2] >= (n_tasks * 64 * 64 * 8) as f64, "block bytes written: {last:?}");
    assert!(last[3] >= last[2], "block bytes read: {last:?}");
    let hist = end.samples.iter().find(|x| x.metric == "ftbag_commit_duration_seconds").expect("the commit histogram");
    let prometheus_parse::Value::Histogram(buckets) = &hist.value else { panic!("not a histogram: {hist:?}") };
    assert!(buckets.windows(2).all(|w| w[0].count <= w[1].count), "cumulative buckets: {buckets:?}");
    let count = value(&end, "ftbag_commit_duration_seconds_count", None).unwrap_or_else(|| {
        // prometheus-parse folds _count into the histogram; the +Inf bucket is the count.
        buckets.last().unwrap().count
    });
    assert!(count >= n_tasks as f64, "every commit in the histogram: {count}");
    assert_eq!(value(&end, "ftbag_jobs", Some(("state", "succeeded"))), Some(1.0));
    assert_eq!(value(&end, "ftbag_tasks_redone_total", Some(("app", "matmul"))), Some(0.0));
}

/// What the page shows of the job and the slaves, read from its DOM.
#[derive(Debug, Default)]
struct Page {
    state: String,
    done: u64,
    total: u64,
    redone: u64,
    slaves: Vec<String>,
}

fn read_page(b: &Browser, job: &str) -> Page {
    let v = b.eval(&format!(
        r#"const r = document.querySelector('tr.job[data-job="{job}"]');
           const slaves = [...document.querySelectorAll('tr.slave')].map(e => e.dataset.slave);
           return r ? {{state: r.dataset.state, done: +r.dataset.done, total: +r.dataset.total, redone: +r.dataset.redone, slaves}}
                    : {{state: "", done: 0, total: 0, redone: 0, slaves}};"#
    ));
    Page {
        state: v["state"].as_str().unwrap_or_default().to_owned(),
        done: v["done"].as_u64().unwrap_or(0),
        total: v["total"].as_u64().unwrap_or(0),
        redone: v["redone"].as_u64().unwrap_or(0),
        slaves: v["slaves"].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect(),
    }
}

#[test]
fn the_dashboard_in_a_browser_shows_a_job_through_a_slave_kill_to_done() {
    let browser = match web::chromium_missing().map_or_else(|| Browser::start(1400, 1100), Err) {
        Ok(b) => b,
        Err(why) => return web::skip(&why),
    };
    let dir = tempfile::tempdir().unwrap();
    let (node, http) = node(dir.path());
    let (job, n_tasks) = submit_matmul(&node.addr, 1536);
    browser.goto(&format!("http://{http}/?token={TOKEN}"));
    // The victim SIGKILLs itself once its third task is computed, before
    // the commit: that task goes back to its bag and is redone.
    let mut victim = slave(&node.addr, "victim", &["--kill-at", "computed:3"]);
    let steady = slave(&node.addr, "steady", &[]);
    let mut replacement = None;
    let mut progress = Vec::new();
    let mut shot_midway = false;
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&out).unwrap();
    let start = Instant::now();
    let last = loop {
        assert!(start.elapsed() < Duration::from_secs(300), "the page did not show the job done; saw {progress:?}");
        let p = read_page(&browser, &job);
        if progress.last() != Some(&p.done) {
            progress.push(p.done);
        }
        if replacement.is_none() && victim.try_wait().unwrap().is_some() {
            replacement = Some(slave(&node.addr, "replacement", &[]));
        }
        let swapped = replacement.is_some() && p.slaves.contains(&"replacement".into()) && !p.slaves.contains(&"victim".into());
        // The picture of the job under way: past half, the charts filled.
        if swapped && !shot_midway && p.state == "running" && p.done * 2 >= p.total {
            browser.screenshot(&out.join("dashboard-running.png"));
            shot_midway = true;
        }
        if p.state == "succeeded" && swapped && p.redone >= 1 {
            break p;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    // Let the charts take a few more points before the final picture.
    std::thread::sleep(Duration::from_secs(2));
    browser.screenshot(&out.join("dashboard-done.png"));
    eprintln!("the page showed progress {progress:?}; last {last:?}; screenshots in {}", out.display());
    assert_eq!((last.done, last.total), (n_tasks, n_tasks), "the page shows every task done");
    assert!(progress.iter().any(|&d| d > 0 && d < n_tasks), "the page showed the job part-way: {progress:?}");
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "progress only rises: {progress:?}");
    assert!(last.slaves.contains(&"steady".into()) && !last.slaves.contains(&"victim".into()), "{last:?}");
    // The page's redone count is the job record's.
    let status: serde_json::Value = serde_json::from_str(&master(&node.addr, &["status", &job, "--json"])).unwrap();
    assert_eq!(status["tasks_redone"].as_u64(), Some(last.redone));
    // For the README: the picture of the job under way if the page caught
    // it there, else the finished one.
    if std::env::var_os("UPDATE_DOCS_SCREENSHOT").is_some() {
        let pick = if shot_midway { "dashboard-running.png" } else { "dashboard-done.png" };
        std::fs::copy(out.join(pick), concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/dashboard.png")).unwrap();
    }
    support::kill_child(steady);
    replacement.into_iter().for_each(support::kill_child);
}

#[test]
fn base64_of_a_screenshot_decodes_with_its_padding() {
    assert_eq!(web::base64_decode("TWFu"), b"Man");
    assert_eq!(web::base64_decode("TWE="), b"Ma");
    assert_eq!(web::base64_decode("TQ=="), b"M");
}

/// One HTTPS GET of `/metrics` trusting `certs/ca.pem`, with the client
/// certificate and the token or without; the status, or why the
/// connection failed.
fn https_metrics(http: &str, certs: &std::path::Path, client_cert: bool, token: bool) -> Result<u16, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls;
    let pem = |name: &str| std::fs::read(certs.join(name)).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut pem("ca.pem").as_slice()) {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = if client_cert {
        let chain = rustls_pemfile::certs(&mut pem("client.pem").as_slice()).map(Result::unwrap).collect();
        let key = rustls_pemfile::private_key(&mut pem("client-key.pem").as_slice()).unwrap().unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    support::runtime().block_on(async {
        let tcp = tokio::net::TcpStream::connect(http).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await.map_err(|e| e.to_string())?;
        let auth = if token { format!("Authorization: {BEARER}\r\n") } else { String::new() };
        let req = format!("GET /metrics HTTP/1.1\r\nHost: {http}\r\n{auth}Connection: close\r\n\r\n");
        tls.write_all(req.as_bytes()).await.map_err(|e| e.to_string())?;
        let mut reply = Vec::new();
        // With TLS 1.3 a refused client certificate shows at the first read.
        tls.read_to_end(&mut reply).await.map_err(|e| e.to_string())?;
        let reply = String::from_utf8_lossy(&reply);
        reply.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("no HTTP status in {reply:?}"))
    })
}

#[test]
fn over_tls_the_dashboard_port_asks_for_the_nodes_client_certificate_and_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    master("unused:1", &["certs", "--out", certs.to_str().unwrap(), "--host", "127.0.0.1", "--client"]);
    let pem = |name: &str| certs.join(name).to_str().unwrap().to_owned();
    let tls = ["--tls-cert".into(), pem("node.pem"), "--tls-key".into(), pem("node-key.pem"), "--tls-client-ca".into(), pem("ca.pem")];
    let (_node, http) = node_with(&dir.path().join("data"), &tls.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(https_metrics(&http, &certs, false, true).is_err(), "no client certificate: refused at the handshake");
    assert_eq!(https_metrics(&http, &certs, true, false), Ok(401), "a certificate without the token");
    assert_eq!(https_metrics(&http, &certs, true, true), Ok(200), "both");
}
