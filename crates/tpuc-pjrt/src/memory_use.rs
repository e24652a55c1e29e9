//! The bytes of the buffers alive on each device of a client, and the most there were since
//! the last reset: what an accelerator's `memory_allocated` and `max_memory_allocated` report.
//! Counted where buffers are made and dropped ([`crate::Buffer`]); the plugin's own pools and
//! the executables' temporaries are not buffers, and are not counted.

use std::collections::HashMap;
use std::sync::Mutex;

/// One device's count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// Bytes of the buffers alive on the device.
    pub allocated: usize,
    /// The most `allocated` has been since the client was made or the peak was last reset.
    pub peak: usize,
}

/// The counts of a client's devices, keyed by the device's PJRT handle.
#[derive(Default)]
pub(crate) struct MemoryCounters {
    devices: Mutex<HashMap<usize, MemoryUse>>,
}

impl MemoryCounters {
    pub(crate) fn add(&self, device: usize, bytes: usize) {
        let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        let entry = devices.entry(device).or_default();
        entry.allocated += bytes;
        entry.peak = entry.peak.max(entry.allocated);
    }

    pub(crate) fn remove(&self, device: usize, bytes: usize) {
        let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = devices.get_mut(&device) {
            entry.allocated = entry.allocated.saturating_sub(bytes);
        }
    }

    pub(crate) fn get(&self, device: usize) -> MemoryUse {
        let devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        devices.get(&device).copied().unwrap_or_default()
    }

    pub(crate) fn reset_peak(&self, device: usize) {
        let mut devices = self.devices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = devices.get_mut(&device) {
            entry.peak = entry.allocated;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_follows_the_most_allocated_until_reset() {
        let counters = MemoryCounters::default();
        counters.add(1, 100);
        counters.add(1, 50);
        counters.remove(1, 100);
        counters.add(2, 7);
        assert_eq!(
            counters.get(1),
            MemoryUse {
                allocated: 50,
                peak: 150
            }
        );
        assert_eq!(
            counters.get(2),
            MemoryUse {
                allocated: 7,
                peak: 7
            }
        );
        counters.reset_peak(1);
        assert_eq!(
            counters.get(1),
            MemoryUse {
                allocated: 50,
                peak: 50
            }
        );
        counters.remove(1, 80);
        assert_eq!(counters.get(1).allocated, 0, "never below zero");
        assert_eq!(counters.get(3), MemoryUse::default());
    }
}
