//! Running a task on a thread of its own: the product's runner.

use super::{Context, Shared, Step, Task};
use crate::background::BackgroundCpu;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Starts `task` on a thread in class `cpu`; it runs until it is `Done` or
/// its handle stops it.
pub(super) fn spawn(
    name: &str,
    cpu: BackgroundCpu,
    mut task: Box<dyn Task>,
    shared: Arc<Shared>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.chars().take(15).collect()).spawn(move || {
        cpu.apply_to_current_thread();
        while !shared.stopped() {
            let cx = Context { blocking: true, now: None, shared: &shared };
            match task.step(&cx) {
                Step::Again => {}
                Step::Wait(timeout) => shared.wait(timeout),
                Step::Done => return,
            }
        }
    })
}
