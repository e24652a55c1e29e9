//! PJRT events: awaited, then destroyed exactly once.
use crate::error::Result;
use crate::plugin::{pjrt_call, Plugin};
use pjrt_sys::*;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a wait polls the event before it sleeps. With more than one core, the plugin's
/// worker finishing the work runs on another core than the waiting thread, and waking a
/// sleeping thread across cores costs tens of microseconds on a virtual machine, several
/// times per call (upload, execution, download): a 0.04 ms program took 0.21 ms on two
/// cores, 0.10 ms polling first (tools/bench_backend.py's `rmsnorm`). On one core polling
/// would only take the worker's time.
fn poll_budget() -> Duration {
    static BUDGET: OnceLock<Duration> = OnceLock::new();
    *BUDGET.get_or_init(
        || match std::thread::available_parallelism().map_or(1, |n| n.get()) {
            1 => Duration::ZERO,
            _ => Duration::from_micros(50),
        },
    )
}

pub(crate) struct Event<'p> {
    plugin: &'p Plugin,
    raw: *mut PJRT_Event,
}

impl<'p> Event<'p> {
    /// Takes ownership of `raw`; a null event (nothing to wait for) is allowed.
    pub(crate) fn new(plugin: &'p Plugin, raw: *mut PJRT_Event) -> Self {
        Event { plugin, raw }
    }

    /// Gives up ownership of the raw event (to be destroyed by whoever takes it).
    pub(crate) fn into_raw(self) -> *mut PJRT_Event {
        let raw = self.raw;
        std::mem::forget(self);
        raw
    }

    /// Whether the event is ready (a null event always is).
    pub(crate) fn is_ready(&self) -> Result<bool> {
        if self.raw.is_null() {
            return Ok(true);
        }
        let mut args = PJRT_Event_IsReady_Args::new();
        args.event = self.raw;
        pjrt_call!(self.plugin, PJRT_Event_IsReady, &mut args)?;
        Ok(args.is_ready)
    }

    /// Blocks until the event is ready; returns the error it carries, if any.
    pub(crate) fn wait(self) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        let budget = poll_budget();
        if !budget.is_zero() {
            let start = Instant::now();
            while start.elapsed() < budget {
                if self.is_ready()? {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        let mut args = PJRT_Event_Await_Args::new();
        args.event = self.raw;
        pjrt_call!(self.plugin, PJRT_Event_Await, &mut args)
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let mut args = PJRT_Event_Destroy_Args::new();
        args.event = self.raw;
        // A failure to free an event leaves nothing to recover; the error itself is freed.
        let _ = pjrt_call!(self.plugin, PJRT_Event_Destroy, &mut args);
    }
}
