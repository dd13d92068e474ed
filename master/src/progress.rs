//! Progress bars on stderr (hidden when not wanted).

use indicatif::{ProgressBar, ProgressStyle};

pub(crate) fn bar(visible: bool, len: u64, what: &str) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{msg:>20} [{bar:40}] {pos}/{len} ({elapsed}, eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_owned());
    bar
}
