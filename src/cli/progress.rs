//! Progress bars of long commands (`cas verify`, `cas gc`, `toolkit add`): drawn on stderr
//! when it is a terminal, and not at all otherwise, so a pipe, a file or a log gets the
//! command's output alone.

use cloud_harness_provision::observe::Observer;
use cloud_harness_store::cas::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub struct Bar {
    bar: ProgressBar,
    /// Whether the bar shows a length (a step whose total is known).
    sized: AtomicBool,
}

const SIZED: &str = "{prefix}: {msg} [{bar:30}] {pos}/{len} ({elapsed})";
const UNSIZED: &str = "{prefix}: {msg} {pos} ({elapsed})";
const DONE: &str = "{prefix}: {msg} ({elapsed})";

impl Bar {
    /// A bar for the command `what`; hidden when stderr is not a terminal.
    pub fn new(what: &'static str) -> Bar {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        bar.set_style(style(UNSIZED));
        bar.set_prefix(what);
        Bar {
            bar,
            sized: AtomicBool::new(false),
        }
    }

    /// Shows an acquisition's phase and bytes while `work` runs, for a toolkit fetch.
    pub fn watching<T>(&self, observer: &Observer, work: impl FnOnce() -> T) -> T {
        /// Stops the ticker however `work` ends (a panic too: the scope waits for the ticker).
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Relaxed) {
                    self.bar.set_message(format!(
                        "{}, {} bytes fetched",
                        observer.phase(),
                        observer.bytes()
                    ));
                    self.bar.tick();
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
            let _stop = Stop(&done);
            work()
        })
    }

    /// Leaves one last line on the terminal: the command, `message` and the time it took.
    pub fn finish(&self, message: String) {
        self.bar.set_style(style(DONE));
        self.bar.finish_with_message(message);
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .expect("the templates are valid")
        .progress_chars("=> ")
}

impl Progress for Bar {
    fn at(&self, step: &'static str, done: u64, total: u64) {
        let sized = total > 0;
        if self.sized.swap(sized, Ordering::Relaxed) != sized {
            self.bar
                .set_style(style(if sized { SIZED } else { UNSIZED }));
        }
        if sized {
            self.bar.set_length(total);
        }
        self.bar.set_message(step);
        self.bar.set_position(done);
    }
}
