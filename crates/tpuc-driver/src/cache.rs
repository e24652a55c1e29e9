//! The in-process cache of compiled programs, keyed before lowering (a hash of the program's
//! identity and the options), so that compiling a graph again costs neither lowering nor
//! emission. Least recently used entries go first beyond a fixed count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::compile::Compiled;

/// How many compiled programs a target keeps.
const CAPACITY: usize = 256;

pub(crate) type Key = [u8; 32];

#[derive(Default)]
pub(crate) struct ExecutableCache {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    map: HashMap<Key, (Arc<Compiled>, u64)>,
    clock: u64,
}

impl ExecutableCache {
    pub(crate) fn get(&self, key: &Key) -> Option<Arc<Compiled>> {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.clock += 1;
        let now = e.clock;
        let (found, used) = e.map.get_mut(key)?;
        *used = now;
        Some(found.clone())
    }

    pub(crate) fn insert(&self, key: Key, compiled: Arc<Compiled>) {
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.clock += 1;
        let now = e.clock;
        e.map.insert(key, (compiled, now));
        while e.map.len() > CAPACITY {
            let oldest = *e
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .expect("the map is not empty")
                .0;
            e.map.remove(&oldest);
        }
    }
}
