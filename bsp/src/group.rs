//! Starting groups: threads in one process (tests, benchmarks), real
//! processes from a launcher (`bsp run`), or a process started by a launcher
//! (`Bsp::from_env`).
//!
//! Environment contract between launcher and process: `BSP_PID`,
//! `BSP_NPROCS`, `BSP_RENDEZVOUS` (launcher address), `STORE_TOKEN`, and
//! optionally `BSP_BIND` (listen address, default `127.0.0.1:0`). A process
//! may instead get a fixed host list in `BSP_HOSTS` (comma separated, entry
//! `i` is where process `i` listens), as `ftbag-hosts run` gives it.

use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::bsplib::{Bsp, Config};
use crate::error::{BspError, Result};
use crate::wire::handshake::Hello;
use crate::wire::mesh::{self, Endpoint};

/// Runs `f` on `p` processes that are threads of this process, each with its
/// own `Bsp` (own sockets, own progress thread). Returns each one's result.
pub fn run_threads<R: Send + 'static>(
    p: usize,
    cfg: Config,
    f: impl Fn(&mut Bsp) -> Result<R> + Send + Sync + 'static,
) -> Result<Vec<Result<R>>> {
    let eps = (0..p).map(|_| Endpoint::bind("127.0.0.1:0")).collect::<Result<Vec<_>>>()?;
    let hosts: Vec<String> = eps.iter().map(|e| e.local_addr().to_string()).collect();
    let f = std::sync::Arc::new(f);
    let handles: Vec<_> = eps
        .into_iter()
        .enumerate()
        .map(|(pid, ep)| {
            let (hosts, cfg, f) = (hosts.clone(), cfg.clone(), f.clone());
            std::thread::Builder::new()
                .name(format!("bsp-{pid}"))
                .spawn(move || {
                    let mut bsp = Bsp::connect(ep, &hosts, pid, cfg)?;
                    let r = f(&mut bsp);
                    bsp.end();
                    r
                })
                .expect("spawn")
        })
        .collect();
    Ok(handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(BspError::Setup("process thread panicked".into())))).collect())
}

impl Bsp {
    /// Joins the group this process was started into (see module docs).
    pub fn from_env(mut cfg: Config) -> Result<Bsp> {
        let var = |k: &str| std::env::var(k).map_err(|_| BspError::Config(format!("{k} is not set")));
        if let Ok(t) = std::env::var("STORE_TOKEN") {
            cfg.token = t.into_bytes();
        }
        cfg.apply_env()?;
        let pid: usize = var("BSP_PID")?.parse().map_err(|_| BspError::Config("BSP_PID".into()))?;
        let bind = std::env::var("BSP_BIND").unwrap_or_else(|_| "127.0.0.1:0".into());
        if let Ok(h) = std::env::var("BSP_HOSTS") {
            let hosts: Vec<String> = h.split(',').map(str::to_string).collect();
            let ep = Endpoint::bind(bind.as_str())?;
            return Bsp::connect(ep, &hosts, pid, cfg);
        }
        let n: usize = var("BSP_NPROCS")?.parse().map_err(|_| BspError::Config("BSP_NPROCS".into()))?;
        let at = var("BSP_RENDEZVOUS")?;
        let ep = Endpoint::bind(bind.as_str())?;
        let hello = Hello { token: cfg.token.clone(), pid: pid as u32, nprocs: n as u32, addr: ep.local_addr().to_string() };
        let hosts = mesh::rendezvous_join(&at, &hello, cfg.setup_timeout)?;
        Bsp::connect(ep, &hosts, pid, cfg)
    }
}

/// Starts `n` local processes of one program as a group.
pub struct Launcher {
    n: usize,
    program: String,
    args: Vec<String>,
    token: String,
    envs: Vec<(String, String)>,
    capture: bool,
}

impl Launcher {
    /// The token is taken from `STORE_TOKEN`, or made up for this group.
    pub fn new(n: usize, program: impl Into<String>, args: Vec<String>) -> Launcher {
        let token = std::env::var("STORE_TOKEN").unwrap_or_else(|_| format!("{:032x}", rand::random::<u128>()));
        Launcher { n, program: program.into(), args, token, envs: Vec::new(), capture: false }
    }
    pub fn token(mut self, t: impl Into<String>) -> Launcher {
        self.token = t.into();
        self
    }
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Launcher {
        self.envs.push((k.into(), v.into()));
        self
    }

    /// Pipe every process's stdout to the launcher (`Job::children_mut`).
    pub fn capture_stdout(mut self, yes: bool) -> Launcher {
        self.capture = yes;
        self
    }

    pub fn spawn(self) -> Result<Job> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let at = listener.local_addr()?.to_string();
        let mut children = Vec::new();
        for pid in 0..self.n {
            let mut c = Command::new(&self.program);
            c.args(&self.args)
                .env("BSP_PID", pid.to_string())
                .env("BSP_NPROCS", self.n.to_string())
                .env("BSP_RENDEZVOUS", &at)
                .env("STORE_TOKEN", &self.token)
                .env_remove("BSP_HOSTS");
            if self.capture {
                c.stdout(std::process::Stdio::piped());
            }
            for (k, v) in &self.envs {
                c.env(k, v);
            }
            children.push(c.spawn()?);
        }
        let (n, token) = (self.n, self.token.into_bytes());
        let rendezvous = std::thread::spawn(move || mesh::rendezvous_serve(&listener, n, &token, Duration::from_secs(60)).map(|_| ()));
        Ok(Job { children, rendezvous: Some(rendezvous) })
    }
}

/// A running group of local processes.
pub struct Job {
    children: Vec<Child>,
    rendezvous: Option<JoinHandle<Result<()>>>,
}

impl Job {
    /// OS process ids, by BSP pid.
    pub fn os_pids(&self) -> Vec<u32> {
        self.children.iter().map(|c| c.id()).collect()
    }
    /// Waits for the rendezvous to finish (every process reported in).
    pub fn wait_formed(&mut self) -> Result<()> {
        match self.rendezvous.take() {
            Some(h) => h.join().map_err(|_| BspError::Setup("rendezvous panicked".into()))?,
            None => Ok(()),
        }
    }
    /// Waits for every process; exit statuses by pid.
    pub fn wait(mut self) -> Result<Vec<ExitStatus>> {
        let formed = self.wait_formed();
        let st = self.children.iter_mut().map(|c| c.wait()).collect::<std::io::Result<Vec<_>>>()?;
        formed?;
        Ok(st)
    }
    /// Waits for every process, with each one's stdout (when captured).
    pub fn wait_output(mut self) -> Result<Vec<(ExitStatus, String)>> {
        use std::io::Read;
        let readers: Vec<_> = self
            .children
            .iter_mut()
            .map(|c| {
                let out = c.stdout.take();
                std::thread::spawn(move || {
                    let mut s = String::new();
                    if let Some(mut o) = out {
                        let _ = o.read_to_string(&mut s);
                    }
                    s
                })
            })
            .collect();
        let formed = self.wait_formed();
        let mut res = Vec::new();
        for (c, r) in self.children.iter_mut().zip(readers) {
            let st = c.wait()?;
            res.push((st, r.join().unwrap_or_default()));
        }
        formed?;
        Ok(res)
    }

    /// Kills every process still running (used when one fails).
    pub fn kill_all(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
        }
    }
    pub fn children_mut(&mut self) -> &mut [Child] {
        &mut self.children
    }
}
