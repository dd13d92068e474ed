//! Ctrl-C, SIGTERM and SIGHUP become messages, so that the cluster is torn
//! down by its `Drop` on the main thread, not in a signal handler.

use std::sync::mpsc::Sender;

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Blocks the signals in this thread and every thread it starts later, and
/// sends each one that arrives through `tx` as `wrap(signal)`. Call it
/// before any other thread starts: a thread started earlier would take the
/// signal's default action, ending the process with its cluster in place.
/// Children get an empty mask again (std resets it between fork and exec).
pub(crate) fn forward<T: Send + 'static>(tx: Sender<T>, wrap: fn(libc::c_int) -> T) -> anyhow::Result<()> {
    // SAFETY: a zeroed sigset_t is valid storage for sigemptyset, which
    // then initialises it; the calls only touch `set`.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in SIGNALS {
            libc::sigaddset(&mut set, s);
        }
        set
    };
    // SAFETY: blocks signals for the calling thread; `set` is initialised.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    anyhow::ensure!(rc == 0, "pthread_sigmask: {}", std::io::Error::from_raw_os_error(rc));
    std::thread::spawn(move || loop {
        let mut sig = 0;
        // SAFETY: waits for one of the blocked signals in `set`.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 && tx.send(wrap(sig)).is_err() {
            return;
        }
    });
    Ok(())
}

pub(crate) fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}
