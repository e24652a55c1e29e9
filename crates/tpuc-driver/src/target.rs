//! A target: one plugin's client over some of its devices, described once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};

use tpuc_hlo::ir::KernelLayout;
use tpuc_pjrt::discover::PluginKind;
use tpuc_pjrt::{Client, ClientOptions, Device, Plugin};

use crate::cache::{ExecutableCache, Key};
use crate::error::{Error, Result};

/// What the pipeline needs to know of where a program will run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetInfo {
    pub kind: PluginKind,
    /// The devices a program is partitioned over (data-parallel when more than one).
    pub devices: usize,
    /// The layout convolution kernels computed once (hoisted) are given: the one the plugin's
    /// convolutions read (XLA:CPU's own), else torch's (the plugin's compiler picks its own).
    pub conv_kernels: KernelLayout,
    /// The newest StableHLO version the plugin reads (`1.16.1`), where it says: user kernels
    /// serialized for a newer one are refused before the plugin sees them.
    pub stablehlo_version: Option<String>,
}

impl TargetInfo {
    /// What `tpuc compile` assumes with no plugin: one device, nothing plugin-specific.
    pub fn offline() -> TargetInfo {
        TargetInfo::new(PluginKind::Other, 1)
    }

    pub fn new(kind: PluginKind, devices: usize) -> TargetInfo {
        let conv_kernels = match kind {
            PluginKind::Cpu => KernelLayout::SpatialInOut,
            _ => KernelLayout::OutInSpatial,
        };
        TargetInfo {
            kind,
            devices,
            conv_kernels,
            stablehlo_version: None,
        }
    }
}

/// A plugin's client and the devices programs run on, with the executables compiled for it.
pub struct Target {
    client: Client,
    plugin_path: PathBuf,
    devices: Vec<Device>,
    /// Every device a one-device program may run on (`Loaded::launch_on`): the eager device's
    /// devices, each its own (`Target::open_each`); the program devices otherwise.
    each: Vec<Device>,
    info: TargetInfo,
    pub(crate) executables: ExecutableCache,
    /// Programs found to need compiling per size rather than per bucket (by their identity).
    pub(crate) not_paddable: Mutex<HashSet<[u8; 32]>>,
    /// Values programs derive from their weights, per set of weight buffers.
    pub(crate) prepared: crate::loaded::PreparedValues,
    /// The programs being compiled (by their cache key), so that a program asked for while it
    /// compiles (in the background, or on another thread) is waited for, not compiled twice.
    compiling: Mutex<HashSet<Key>>,
    compiled_one: Condvar,
    /// The buckets each program (by its identity) was last called in, which show the sizes
    /// that grow (`Target::compile_next_buckets`).
    pub(crate) last_buckets: Mutex<HashMap<Key, BTreeMap<String, i64>>>,
}

/// The right to compile the program of one cache key; given back when dropped. `T` is how the
/// holder reaches the target: borrowed, or shared with a thread compiling in the background.
pub(crate) struct Compiling<T: Deref<Target = Target>> {
    target: T,
    pub(crate) key: Key,
}

impl<T: Deref<Target = Target>> Drop for Compiling<T> {
    fn drop(&mut self) {
        let mut compiling = self
            .target
            .compiling
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        compiling.remove(&self.key);
        self.target.compiled_one.notify_all();
    }
}

impl Target {
    /// A client of `plugin` (a name: cpu, tpu, cuda; or a path; `None` for $TPUC_PJRT_PLUGIN,
    /// else cpu) over `devices` devices. A named plugin is looked for in `search_paths` first
    /// (a Python interpreter's `sys.path`), then where `tpuc_pjrt::discover` looks.
    pub fn open(plugin: Option<&str>, devices: usize, search_paths: &[PathBuf]) -> Result<Target> {
        Target::opened(plugin, devices, search_paths, false)
    }

    /// A client of `plugin` whose programs run on one device, any of `devices` devices each
    /// on its own (the eager device's `tpuc:0`, `tpuc:1`, ...): its programs are compiled
    /// portable when there are several. `None` takes every device the plugin has (for the CPU
    /// plugin, which has as many as it is asked for, one).
    pub fn open_each(
        plugin: Option<&str>,
        devices: Option<usize>,
        search_paths: &[PathBuf],
    ) -> Result<Target> {
        let path = tpuc_pjrt::discover::resolve_in(plugin, search_paths)?;
        let count = match devices {
            Some(count) => count,
            None if PluginKind::of(&path).takes_device_count() => 1,
            None => {
                // Every device the plugin has: asked of a client that is then dropped.
                let probe = Target::opened(plugin, 1, search_paths, false)?;
                probe.client.addressable_devices()?.len()
            }
        };
        Target::opened(plugin, count, search_paths, true)
    }

    fn opened(
        plugin: Option<&str>,
        devices: usize,
        search_paths: &[PathBuf],
        each: bool,
    ) -> Result<Target> {
        if devices < 1 {
            return Err(Error::Invalid("a target needs at least one device".into()));
        }
        let path = tpuc_pjrt::discover::resolve_in(plugin, search_paths)?;
        let kind = PluginKind::of(&path);
        let loaded = Plugin::load(&path)?;
        let options = ClientOptions {
            cpu_device_count: kind.takes_device_count().then_some(devices as i64),
            ..ClientOptions::default()
        };
        let client = Client::new(&loaded, &options).map_err(|source| Error::Start {
            path: path.clone(),
            source,
        })?;
        let available = client.addressable_devices()?;
        if available.len() < devices {
            return Err(Error::Invalid(format!(
                "{devices} devices requested, but the {} plugin has {}",
                client.platform_name()?,
                available.len()
            )));
        }
        let opened: Vec<Device> = available.into_iter().take(devices).collect();
        let program_devices = if each { 1 } else { devices };
        let stablehlo_version = client
            .plugin()
            .attribute("stablehlo_current_version")
            .map(ToString::to_string);
        Ok(Target {
            client,
            plugin_path: path,
            devices: opened[..program_devices].to_vec(),
            each: opened,
            info: TargetInfo {
                stablehlo_version,
                ..TargetInfo::new(kind, program_devices)
            },
            executables: ExecutableCache::default(),
            not_paddable: Mutex::default(),
            prepared: Default::default(),
            compiling: Mutex::default(),
            compiled_one: Condvar::new(),
            last_buckets: Mutex::default(),
        })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn plugin_path(&self) -> &Path {
        &self.plugin_path
    }

    /// The devices programs run on, in partition order.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    pub fn info(&self) -> &TargetInfo {
        &self.info
    }

    /// Every device a one-device program of the target may run on (`Target::open_each`).
    pub fn each_device(&self) -> &[Device] {
        &self.each
    }

    /// How many sets of values derived from weights are kept (one per prepared module and set
    /// of weight buffers alive).
    pub fn prepared_sets(&self) -> usize {
        self.prepared.len()
    }

    /// The right to compile the program of `key`, once no one else compiles it (waiting until
    /// then): the caller then looks in the cache again before compiling.
    pub(crate) fn compiling(&self, key: Key) -> Compiling<&Target> {
        let mut compiling = self.compiling.lock().unwrap_or_else(|p| p.into_inner());
        while compiling.contains(&key) {
            compiling = self
                .compiled_one
                .wait(compiling)
                .unwrap_or_else(|p| p.into_inner());
        }
        compiling.insert(key);
        Compiling { target: self, key }
    }

    /// The right to compile the program of `key`, for a thread compiling in the background,
    /// unless someone compiles it already (no waiting).
    pub(crate) fn reserve(self: &Arc<Self>, key: Key) -> Option<Compiling<Arc<Target>>> {
        let mut compiling = self.compiling.lock().unwrap_or_else(|p| p.into_inner());
        compiling.insert(key).then(|| Compiling {
            target: self.clone(),
            key,
        })
    }

    pub fn platform(&self) -> Result<String> {
        Ok(self.client.platform_name()?)
    }
}
