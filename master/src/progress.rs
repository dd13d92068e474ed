//! Progress bars on stderr (hidden when not wanted).

use indicatif::{ProgressBar, ProgressStyle};

pub(crate) fn bar(visible: bool, len: u64, what: &str) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        // No {eta}: indicatif's guess said "eta 0s" with no slave alive;
        // callers put their own time left in the message.
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} ({elapsed}) {msg}").expect("valid template").progress_chars("=> "),
    );
    bar.set_prefix(what.to_owned());
    bar
}
