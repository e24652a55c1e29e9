//! A cache of compiled executables on disk, shared by processes: a module compiled once is
//! afterwards loaded instead of compiled (the plugin's compilation is most of a graph's first
//! call; loading takes milliseconds).
//!
//! An entry's name is a SHA-256 of everything the plugin's output depends on: the module, the
//! compile options, the plugin (path, size, modification time, platform and version),
//! `XLA_FLAGS`, the host CPU and the threads the plugin may use. Entries are written whole (a
//! temporary file renamed into place, so concurrent processes see a complete entry or none) and
//! checked when read (a checksum, then the plugin's own checks); a damaged entry is compiled
//! again and replaced. The directory is kept under a size limit, least recently used entries
//! going first. Failing to store never fails a compilation.
use crate::error::{Error, Result};
use crate::{Client, CompileOptions, Executable};
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The first bytes of an entry; a new format gets a new tag (and so new names).
const MAGIC: &[u8; 8] = b"TPUCEXE1";
const EXTENSION: &str = "pjrt";
/// Entries being written are named `<key>.tmp<pid>-<time>`.
const TEMPORARY: &str = "tmp";
/// Temporary files older than this are left over from a process that died while writing.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// Where and how large the cache is, and how it behaves on a miss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileCache {
    dir: PathBuf,
    max_bytes: u64,
    /// Directories of other caches read (never written, pruned or repaired) after this one: a
    /// cache shared between machines, filled elsewhere (`TPUC_CACHE_SHARED`).
    shared: Vec<PathBuf>,
    /// A miss is an error, not a compilation (`TPUC_CACHE_MODE=require`): for deployments that
    /// must never compile.
    require: bool,
    /// Where the module of each miss is written (`TPUC_CACHE_DUMP_MISSES`).
    dump_misses: Option<PathBuf>,
}

/// The cache's record of what it did, in its directory: one JSON object per line.
const STATS: &str = "stats.jsonl";
/// The eager device's plans (`device_plans_dir`).
const DEVICE_PLANS: &str = "device-plans";
/// The record is rotated past this size (the previous one kept as `stats.1.jsonl`).
const STATS_MAX_BYTES: u64 = 8 << 20;

/// What the cache did, from its record (`CompileCache::stats`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheStats {
    /// Compilations asked of the cache.
    pub requests: u64,
    /// Those served from it (this directory or a shared one).
    pub hits: u64,
    /// Those compiled instead, and those refused (`TPUC_CACHE_MODE=require`).
    pub misses: u64,
    pub refused: u64,
    /// The seconds the plugin spent compiling on misses.
    pub compile_seconds: f64,
    /// Misses by reason: "new graph", "entry gone" (evicted, damaged, removed), or "changed:
    /// PARTS" (what changed since the graph was last compiled: plugin, XLA flags, host CPU,
    /// options, module (the graph or its sizes)).
    pub reasons: std::collections::BTreeMap<String, u64>,
}

/// What the cache did for one compilation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Loaded from the cache: not compiled.
    Hit,
    /// Compiled, and stored for next time.
    Stored,
    /// Compiled, but not stored (the reason: an unwritable directory, a full disk, a plugin
    /// that cannot serialize executables).
    NotStored(String),
}

impl CompileCache {
    /// The size limit unless `TPUC_CACHE_MAX_MB` sets another.
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;

    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> Self {
        CompileCache {
            dir: dir.into(),
            max_bytes,
            shared: Vec::new(),
            require: false,
            dump_misses: None,
        }
    }

    /// The cache, also reading the caches in `shared` (after its own; never writing them).
    pub fn with_shared(mut self, shared: Vec<PathBuf>) -> Self {
        self.shared = shared;
        self
    }

    /// The cache, refusing to compile on a miss when `require`.
    pub fn requiring(mut self, require: bool) -> Self {
        self.require = require;
        self
    }

    /// The cache, writing the module of each miss into `dir`.
    pub fn dumping_misses(mut self, dir: Option<PathBuf>) -> Self {
        self.dump_misses = dir;
        self
    }

    /// The cache to use: in `dir` when given, else in `$TPUC_CACHE_DIR`, else in
    /// `$XDG_CACHE_HOME/tpuc` or `~/.cache/tpuc`; `None` when the directory given is `off` (or
    /// no home directory is known). The size limit is `$TPUC_CACHE_MAX_MB` megabytes (default
    /// 1024). `$TPUC_CACHE_SHARED` (directories separated by `:`) names caches read after it,
    /// never written; `$TPUC_CACHE_MODE=require` makes a miss an error; `$TPUC_CACHE_DUMP_MISSES`
    /// names a directory for the module of each miss.
    pub fn configured(dir: Option<&str>) -> Result<Option<CompileCache>> {
        Self::configured_with(dir, |name| std::env::var(name).ok())
    }

    /// `configured`, the environment read through `env`.
    fn configured_with(
        dir: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<CompileCache>> {
        let env = |name: &str| env(name).filter(|value| !value.is_empty());
        let dir = match dir.map(str::to_string).or_else(|| env("TPUC_CACHE_DIR")) {
            Some(dir) if dir == "off" => return Ok(None),
            Some(dir) => PathBuf::from(dir),
            None => match env("XDG_CACHE_HOME")
                .or_else(|| env("HOME").map(|home| format!("{home}/.cache")))
            {
                Some(base) => Path::new(&base).join("tpuc"),
                None => return Ok(None),
            },
        };
        let max_bytes = match env("TPUC_CACHE_MAX_MB") {
            None => Self::DEFAULT_MAX_BYTES,
            Some(text) => match text.parse::<u64>() {
                Ok(mb) => mb.saturating_mul(1 << 20),
                Err(_) => {
                    return Err(Error::Invalid(format!(
                        "TPUC_CACHE_MAX_MB must be a whole number of megabytes, not {text:?}"
                    )))
                }
            },
        };
        let require = match env("TPUC_CACHE_MODE").as_deref() {
            None | Some("normal") => false,
            Some("require") => true,
            Some(other) => {
                return Err(Error::Invalid(format!(
                    "TPUC_CACHE_MODE is normal or require (a miss is an error), not {other:?}"
                )))
            }
        };
        let shared = env("TPUC_CACHE_SHARED")
            .map(|dirs| {
                dirs.split(':')
                    .filter(|d| !d.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Some(
            CompileCache::new(dir, max_bytes)
                .with_shared(shared)
                .requiring(require)
                .dumping_misses(env("TPUC_CACHE_DUMP_MISSES").map(PathBuf::from)),
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the eager device keeps its plans of ops (what each op's program is and how its
    /// arguments and results map to it), so that a second process plans nothing it has seen.
    /// The executables they name stay this cache's entries; `clear` empties both.
    pub fn device_plans_dir(&self) -> PathBuf {
        self.dir.join(DEVICE_PLANS)
    }

    /// `module`, the graph named `graph` (what a miss is explained by, and errors name),
    /// compiled with `options` on `client`'s plugin: loaded from the cache (its directory, then
    /// the shared ones) when an earlier compilation stored it, else compiled and stored in its
    /// directory. Every request is recorded (`stats`), a miss with its reason.
    pub fn compile(
        &self,
        client: &Client,
        module: &[u8],
        options: &CompileOptions,
        graph: &str,
    ) -> Result<(Executable, CacheOutcome)> {
        let (key, parts) = key(client, module, options)?;
        let name = format!("{key}.{EXTENSION}");
        let path = self.dir.join(&name);
        if let Some(exe) = load(client, &path, true) {
            // Recently used entries are the last to go when the cache is pruned.
            if let Ok(file) = fs::File::options().write(true).open(&path) {
                let _ = file.set_modified(SystemTime::now());
            }
            self.record(graph, &key, &parts, "hit", None, 0.0);
            return Ok((exe, CacheOutcome::Hit));
        }
        if let Some(exe) = self
            .shared
            .iter()
            .find_map(|dir| load(client, &dir.join(&name), false))
        {
            self.record(graph, &key, &parts, "hit", None, 0.0);
            return Ok((exe, CacheOutcome::Hit));
        }
        let why = self.explain(graph, &key, &parts);
        if self.require {
            self.record(graph, &key, &parts, "refused", Some(&why), 0.0);
            return Err(Error::NotCached(format!(
                "{graph} is not in the cache of compiled executables in {} ({why}), and \
                 TPUC_CACHE_MODE=require forbids compiling it",
                self.dir.display()
            )));
        }
        if let Some(dir) = &self.dump_misses {
            let file: String = graph
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let _ = fs::create_dir_all(dir)
                .and_then(|()| fs::write(dir.join(format!("{file}-{}.mlir", &key[..16])), module));
        }
        let started = std::time::Instant::now();
        let exe = client.compile_mlir(module, options)?;
        let seconds = started.elapsed().as_secs_f64();
        let outcome = match self.store(&exe, &path) {
            Ok(()) => CacheOutcome::Stored,
            Err(reason) => CacheOutcome::NotStored(reason),
        };
        self.record(graph, &key, &parts, "compiled", Some(&why), seconds);
        Ok((exe, outcome))
    }

    /// Why `graph`, of key `key` made of `parts`, is not in the cache: it was never compiled
    /// here, its entry is gone (this very key was compiled before), or what changed since it
    /// was last compiled.
    fn explain(&self, graph: &str, key: &str, parts: &KeyParts) -> String {
        let records = self.records();
        if records
            .iter()
            .any(|r| r.get("key").and_then(|k| k.as_str()) == Some(key))
        {
            return "entry gone".into();
        }
        let last = records
            .iter()
            .rev()
            .find(|r| r.get("graph").and_then(|g| g.as_str()) == Some(graph));
        let Some(last) = last else {
            return "new graph".into();
        };
        let changed: Vec<&str> = parts
            .iter()
            .filter(|(part, hash)| {
                last.get("parts")
                    .and_then(|p| p.get(*part))
                    .and_then(|h| h.as_str())
                    != Some(hash)
            })
            .map(|(part, _)| *part)
            .collect();
        format!("changed: {}", changed.join(", "))
    }

    /// Appends one request to the cache's record (a line written whole, so that processes
    /// sharing the directory do not mix their lines); failing to write it is not an error.
    fn record(
        &self,
        graph: &str,
        key: &str,
        parts: &KeyParts,
        outcome: &str,
        why: Option<&str>,
        seconds: f64,
    ) {
        let parts: serde_json::Map<String, serde_json::Value> = parts
            .iter()
            .map(|(part, hash)| (part.to_string(), serde_json::Value::from(hash.as_str())))
            .collect();
        let time = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let line = serde_json::json!({
            "time": time, "graph": graph, "key": key, "parts": parts, "outcome": outcome,
            "why": why, "seconds": seconds,
        });
        let path = self.dir.join(STATS);
        if fs::metadata(&path).is_ok_and(|m| m.len() > STATS_MAX_BYTES) {
            let _ = fs::rename(&path, self.dir.join("stats.1.jsonl"));
        }
        let _ = fs::create_dir_all(&self.dir).and_then(|()| {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)?
                .write_all(format!("{line}\n").as_bytes())
        });
    }

    /// The cache's record, oldest first (lines that do not parse, such as one cut short by a
    /// crash, are skipped).
    fn records(&self) -> Vec<serde_json::Value> {
        ["stats.1.jsonl", STATS]
            .iter()
            .filter_map(|name| fs::read_to_string(self.dir.join(name)).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|line| serde_json::from_str(line).ok())
                    .collect::<Vec<serde_json::Value>>()
            })
            .collect()
    }

    /// What the cache did, from its record: requests, hits, misses by reason, compile time.
    pub fn stats(&self) -> CacheStats {
        let mut stats = CacheStats::default();
        for record in self.records() {
            stats.requests += 1;
            match record.get("outcome").and_then(|o| o.as_str()) {
                Some("hit") => stats.hits += 1,
                outcome => {
                    stats.misses += 1;
                    stats.refused += u64::from(outcome == Some("refused"));
                    stats.compile_seconds += record
                        .get("seconds")
                        .and_then(|s| s.as_f64())
                        .unwrap_or(0.0);
                    let why = record
                        .get("why")
                        .and_then(|w| w.as_str())
                        .unwrap_or("unknown");
                    *stats.reasons.entry(why.to_string()).or_default() += 1;
                }
            }
        }
        stats
    }

    fn store(&self, exe: &Executable, path: &Path) -> std::result::Result<(), String> {
        let payload = exe
            .serialize()
            .map_err(|e| format!("the plugin cannot serialize the executable: {e}"))?;
        let written = (|| -> std::io::Result<()> {
            fs::create_dir_all(&self.dir)?;
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            let temporary =
                path.with_extension(format!("{TEMPORARY}{}-{nanos}", std::process::id()));
            // No fsync: an entry cut short by a crash fails its checksum and is compiled again.
            let mut file = fs::File::create(&temporary)?;
            let result = file
                .write_all(MAGIC)
                .and_then(|()| file.write_all(&Sha256::digest(&payload)))
                .and_then(|()| file.write_all(&payload))
                .and_then(|()| fs::rename(&temporary, path));
            if result.is_err() {
                let _ = fs::remove_file(&temporary);
            }
            result
        })();
        written.map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        self.prune(path);
        Ok(())
    }

    /// Removes the least recently used entries until the cache is under its limit, sparing
    /// `keep` (the entry just stored), and temporary files left by dead writers.
    fn prune(&self, keep: &Path) {
        let Ok(files) = self.files() else { return };
        let now = SystemTime::now();
        for file in files.iter().filter(|f| f.temporary) {
            if now.duration_since(file.modified).unwrap_or_default() > STALE_TEMPORARY {
                let _ = fs::remove_file(&file.path);
            }
        }
        let mut entries: Vec<&CacheFile> = files.iter().filter(|f| !f.temporary).collect();
        let mut total: u64 = entries.iter().map(|f| f.bytes).sum();
        entries.retain(|f| f.path != keep);
        entries.sort_by_key(|f| f.modified);
        for file in entries {
            if total <= self.max_bytes {
                break;
            }
            if fs::remove_file(&file.path).is_ok() {
                total -= file.bytes;
            }
        }
    }

    /// The size limit in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// How many executables the cache holds and their bytes (none if the directory is missing).
    pub fn usage(&self) -> std::io::Result<(usize, u64)> {
        let files = self.files()?;
        let entries = files.iter().filter(|f| !f.temporary);
        Ok((entries.clone().count(), entries.map(|f| f.bytes).sum()))
    }

    /// How many plans the eager device keeps (`device_plans_dir`) and their bytes.
    pub fn device_plans_usage(&self) -> std::io::Result<(usize, u64)> {
        let listing = match fs::read_dir(self.device_plans_dir()) {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
            Err(e) => return Err(e),
        };
        let (mut count, mut bytes) = (0, 0);
        for item in listing {
            let item = item?;
            if item.path().extension().is_some_and(|e| e == "plan") {
                count += 1;
                bytes += item.metadata().map_or(0, |m| m.len());
            }
        }
        Ok((count, bytes))
    }

    /// Removes every executable (and temporary file) of the cache and the device's plans;
    /// returns how many executables went. Other files in the directory stay.
    pub fn clear(&self) -> std::io::Result<usize> {
        match fs::remove_dir_all(self.device_plans_dir()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut removed = 0;
        for file in self.files()? {
            fs::remove_file(&file.path)?;
            removed += usize::from(!file.temporary);
        }
        for record in [STATS, "stats.1.jsonl"] {
            match fs::remove_file(self.dir.join(record)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(removed)
    }

    /// The cache's own files in its directory (entries and temporaries; the directory may hold
    /// others, which are never touched). A missing directory holds none.
    fn files(&self) -> std::io::Result<Vec<CacheFile>> {
        let listing = match fs::read_dir(&self.dir) {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut files = Vec::new();
        for item in listing {
            let item = item?;
            let path = item.path();
            let named = path.file_stem().is_some_and(|stem| {
                stem.len() == 64
                    && stem
                        .to_string_lossy()
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit())
            });
            let extension = path.extension().map(|e| e.to_string_lossy().into_owned());
            let temporary = match extension.as_deref() {
                Some(EXTENSION) => false,
                Some(e) if e.starts_with(TEMPORARY) => true,
                _ => continue,
            };
            let Ok(meta) = item.metadata() else { continue };
            if named && meta.is_file() {
                files.push(CacheFile {
                    modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    bytes: meta.len(),
                    path,
                    temporary,
                });
            }
        }
        Ok(files)
    }
}

/// One of the cache's files.
struct CacheFile {
    path: PathBuf,
    bytes: u64,
    modified: SystemTime,
    /// Being written (or left by a writer that died), not an entry.
    temporary: bool,
}

/// `module` compiled with `options` on `client`, through `cache` when there is one; the cache's
/// outcome, `None` without a cache.
pub fn compile_with_cache(
    client: &Client,
    module: &[u8],
    options: &CompileOptions,
    cache: Option<&CompileCache>,
    graph: &str,
) -> Result<(Executable, Option<CacheOutcome>)> {
    match cache {
        Some(cache) => cache
            .compile(client, module, options, graph)
            .map(|(exe, outcome)| (exe, Some(outcome))),
        None => client.compile_mlir(module, options).map(|exe| (exe, None)),
    }
}

/// The executable stored at `path`, if there is a sound one; a damaged one is removed when
/// `repair` (not in a shared cache, which is read only).
fn load(client: &Client, path: &Path, repair: bool) -> Option<Executable> {
    let bytes = fs::read(path).ok()?;
    let header = MAGIC.len() + 32;
    let sound = bytes.len() > header
        && bytes.starts_with(MAGIC)
        && bytes[MAGIC.len()..header] == Sha256::digest(&bytes[header..])[..];
    let loaded = if sound {
        let payload = &bytes[header..];
        crate::stderr_filter::filtered(is_loader_false_alarm, || {
            client.load_executable(payload).ok()
        })
    } else {
        None
    };
    if loaded.is_none() && repair {
        let _ = fs::remove_file(path);
    }
    loaded
}

/// What XLA logs when loading an executable that says nothing about it: the tuning-feature
/// alarms below, and absl's notice, before the first line it logs in a process, that its log is
/// not set up ("All log messages before absl::InitializeLog() is called are written to
/// STDERR"), which would otherwise stay behind alone.
fn is_loader_false_alarm(line: &str) -> bool {
    is_tuning_feature_alarm(line) || line.contains("before absl::InitializeLog() is called")
}

/// XLA:CPU's loader compares the features an executable was compiled for, which include LLVM's
/// tuning features (`+prefer-no-gather`, `+fast-gather`, ...), with the host's, which never do,
/// and logs an error ("could lead to execution errors such as SIGILL") for each: a false alarm
/// on every load on such CPUs. Tuning features change no instruction set; a real mismatch cannot
/// reach the loader either, as an entry's key holds the host CPU's features.
fn is_tuning_feature_alarm(line: &str) -> bool {
    const TUNING: [&str; 5] = ["prefer-", "fast-", "slow-", "false-deps-", "tuning-"];
    line.contains("cpu_aot_loader")
        && line
            .split_once("Target machine feature +")
            .is_some_and(|(_, rest)| TUNING.iter().any(|prefix| rest.starts_with(prefix)))
}

/// The name of the entry holding `module` compiled with `options` on `client`'s plugin.
/// The parts of an entry's key, each hashed on its own so that a miss can say which changed
/// since the graph was last compiled: (part, its hash in hex).
type KeyParts = Vec<(&'static str, String)>;

/// An entry's name (a SHA-256 over its parts' hashes) and those parts.
fn key(client: &Client, module: &[u8], options: &CompileOptions) -> Result<(String, KeyParts)> {
    let plugin = client.plugin();
    let file = fs::metadata(plugin.path()).ok();
    let modified = file
        .as_ref()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let threads = std::thread::available_parallelism().map_or(0, |n| n.get());
    let part = |fields: &[(&str, &[u8])]| -> String {
        let mut hash = Sha256::new();
        for (name, value) in fields {
            hash.update(name.as_bytes());
            hash.update((value.len() as u64).to_le_bytes());
            hash.update(value);
        }
        hex(&hash.finalize())
    };
    let xla_flags = std::env::var("XLA_FLAGS").unwrap_or_default();
    let nproc = std::env::var("NPROC").unwrap_or_default();
    let parts: KeyParts = vec![
        (
            "plugin",
            part(&[
                ("format", MAGIC),
                ("plugin", plugin.path().to_string_lossy().as_bytes()),
                ("plugin size", &file.map_or(0, |m| m.len()).to_le_bytes()),
                ("plugin modified", &modified.to_le_bytes()),
                ("platform", client.platform_name()?.as_bytes()),
                ("platform version", client.platform_version()?.as_bytes()),
            ]),
        ),
        (
            "XLA flags",
            part(&[
                ("XLA_FLAGS", xla_flags.as_bytes()),
                ("NPROC", nproc.as_bytes()),
                ("threads", &threads.to_le_bytes()),
            ]),
        ),
        (
            "host CPU",
            part(&[("cpu", crate::host_cpu::description().as_bytes())]),
        ),
        ("options", part(&[("options", &options.encode()?)])),
        // The module holds the graph's sizes: for one graph, another module is other sizes.
        (
            "module (the graph or its sizes)",
            part(&[("module", module)]),
        ),
    ];
    let mut hash = Sha256::new();
    for (name, value) in &parts {
        hash.update(name.as_bytes());
        hash.update(value.as_bytes());
    }
    Ok((hex(&hash.finalize()), parts))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configured(dir: Option<&str>, vars: &[(&str, &str)]) -> Result<Option<CompileCache>> {
        CompileCache::configured_with(dir, |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn the_directory_comes_from_the_caller_then_the_environment() {
        let home = [("HOME", "/home/u")];
        let default = CompileCache::new("/home/u/.cache/tpuc", CompileCache::DEFAULT_MAX_BYTES);
        assert_eq!(configured(None, &home).unwrap(), Some(default.clone()));
        // An empty variable counts as unset.
        let empty = [("HOME", "/home/u"), ("TPUC_CACHE_DIR", "")];
        assert_eq!(configured(None, &empty).unwrap(), Some(default));
        let xdg = [("HOME", "/home/u"), ("XDG_CACHE_HOME", "/xdg")];
        assert_eq!(
            configured(None, &xdg).unwrap().unwrap().dir(),
            Path::new("/xdg/tpuc")
        );
        let set = [
            ("HOME", "/home/u"),
            ("TPUC_CACHE_DIR", "/c"),
            ("TPUC_CACHE_MAX_MB", "3"),
        ];
        assert_eq!(
            configured(None, &set).unwrap(),
            Some(CompileCache::new("/c", 3 << 20))
        );
        assert_eq!(
            configured(Some("/given"), &set).unwrap().unwrap().dir(),
            Path::new("/given")
        );
        assert_eq!(
            configured(None, &[("TPUC_CACHE_DIR", "off")]).unwrap(),
            None
        );
        assert_eq!(configured(Some("off"), &set).unwrap(), None);
        assert_eq!(configured(None, &[]).unwrap(), None, "no home, no default");
    }

    #[test]
    fn a_size_that_is_not_a_number_is_refused() {
        let bad = [("HOME", "/h"), ("TPUC_CACHE_MAX_MB", "1G")];
        let message = configured(None, &bad).unwrap_err().to_string();
        assert!(
            message.contains("TPUC_CACHE_MAX_MB") && message.contains("\"1G\""),
            "{message}"
        );
    }

    #[test]
    fn only_tuning_feature_alarms_are_dropped() {
        let alarm = |feature: &str| {
            format!("E0000 00:00:1.2 7 cpu_aot_loader.cc:195] Loading XLA:CPU AOT result. Target machine feature +{feature} is not  supported on the host machine.\n")
        };
        assert!(is_tuning_feature_alarm(&alarm("prefer-no-gather")));
        assert!(is_tuning_feature_alarm(&alarm("fast-gather")));
        assert!(!is_tuning_feature_alarm(&alarm("avx512f")));
        assert!(!is_tuning_feature_alarm(
            "E0000 cpu_aot_loader.cc:12] something else\n"
        ));
        assert!(is_loader_false_alarm(
            "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        ));
        assert!(!is_loader_false_alarm(
            "E0000 cpu_aot_loader.cc:12] something else\n"
        ));
    }
}
