//! Finding PJRT plugins on this machine: by path, by name, or through `TPUC_PJRT_PLUGIN`.
//!
//! Named plugins are the shared libraries that Python packages install:
//! `cpu` (`fastatomstruct-xla-cpu`), `tpu` (`libtpu`), `cuda` (`jax-cuda12-pjrt` or
//! `jax-cuda13-pjrt`). They are looked for in the site-packages of the active virtual
//! environment, of a `.venv` in the current directory or any parent (or beside the running
//! executable), of the user's and the system's Python installations, and of pyenv's versions.
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// The environment variable naming the default plugin (a name or a path).
pub const PLUGIN_ENV: &str = "TPUC_PJRT_PLUGIN";

/// A plugin tpuc knows by name.
#[derive(Debug, Clone, Copy)]
pub struct KnownPlugin {
    pub name: &'static str,
    /// The pip package that installs it.
    pub package: &'static str,
    /// The library's paths inside site-packages, in order of preference.
    pub libraries: &'static [&'static str],
}

pub const KNOWN_PLUGINS: &[KnownPlugin] = &[
    KnownPlugin {
        name: "cpu",
        package: "fastatomstruct-xla-cpu",
        libraries: &["fastatomstruct_xla_cpu/libpjrt_cpu.so"],
    },
    KnownPlugin {
        name: "tpu",
        package: "libtpu",
        libraries: &["libtpu/libtpu.so"],
    },
    KnownPlugin {
        name: "cuda",
        package: "jax-cuda12-pjrt",
        libraries: &[
            "jax_plugins/xla_cuda12/xla_cuda_plugin.so",
            "jax_plugins/xla_cuda13/xla_cuda_plugin.so",
        ],
    },
];

/// The plugin path for `spec`: a path (anything with a `/` or ending in `.so`), a known name,
/// or, when `spec` is `None`, `$TPUC_PJRT_PLUGIN` or else `cpu`.
pub fn resolve(spec: Option<&str>) -> Result<PathBuf> {
    resolve_in(spec, &[])
}

/// [`resolve`], looking for a named plugin in `first` (directories such as a running Python
/// interpreter's `sys.path`, the truth about where its packages are) before the usual places.
pub fn resolve_in(spec: Option<&str>, first: &[PathBuf]) -> Result<PathBuf> {
    let from_env = std::env::var(PLUGIN_ENV).ok().filter(|s| !s.is_empty());
    let spec = spec
        .map(str::to_string)
        .or(from_env)
        .unwrap_or_else(|| "cpu".into());
    if spec.contains('/') || spec.ends_with(".so") {
        let path = PathBuf::from(&spec);
        if !path.is_file() {
            return Err(Error::PluginLoad {
                path,
                reason: "no such file".into(),
            });
        }
        return Ok(path);
    }
    let Some(known) = KNOWN_PLUGINS.iter().find(|k| k.name == spec) else {
        let names: Vec<&str> = KNOWN_PLUGINS.iter().map(|k| k.name).collect();
        return Err(Error::Invalid(format!(
            "unknown PJRT plugin `{spec}`: give a path to a plugin library or one of {}",
            names.join(", ")
        )));
    };
    let mut roots: Vec<PathBuf> = first.iter().filter(|d| d.is_dir()).cloned().collect();
    roots.extend(site_packages().into_iter().filter(|d| !first.contains(d)));
    find_in(known, &roots)
        .into_iter()
        .next()
        .ok_or_else(|| Error::PluginNotFound {
            name: known.name.into(),
            package: known.package.into(),
            searched: roots.iter().map(|r| r.display().to_string()).collect(),
        })
}

/// Which plugin a library is, as far as tpuc treats plugins differently: the one answer to
/// "which plugin is this and what does it need".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// XLA's CPU plugin: takes the `cpu_device_count` client option; its minimum and maximum
    /// drop NaN unless told otherwise; its convolutions read kernels as [spatial..., in, out].
    Cpu,
    /// libtpu: queries the GCE metadata server at start-up unless told not to.
    Tpu,
    /// XLA's CUDA plugin.
    Cuda,
    /// Any other library.
    Other,
}

impl PluginKind {
    /// The kind of the plugin library at `path`, by its file name.
    pub fn of(path: &Path) -> PluginKind {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.contains("pjrt_cpu") {
            PluginKind::Cpu
        } else if name.starts_with("libtpu") {
            PluginKind::Tpu
        } else if name.contains("xla_cuda") {
            PluginKind::Cuda
        } else {
            PluginKind::Other
        }
    }

    /// Whether the plugin takes the number of devices as a client option. Others refuse
    /// options they do not know (libtpu does).
    pub fn takes_device_count(self) -> bool {
        self == PluginKind::Cpu
    }
}

/// Every installed copy of every known plugin, as (name, path).
pub fn installed() -> Vec<(&'static str, PathBuf)> {
    installed_in(&[])
}

/// [`installed`], looking in `first` too (before the usual places).
pub fn installed_in(first: &[PathBuf]) -> Vec<(&'static str, PathBuf)> {
    let mut roots = first.to_vec();
    roots.extend(site_packages());
    KNOWN_PLUGINS
        .iter()
        .flat_map(|known| find_in(known, &roots).into_iter().map(|p| (known.name, p)))
        .collect()
}

fn find_in(known: &KnownPlugin, roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    for root in roots {
        for library in known.libraries {
            let path = root.join(library);
            if path.is_file() {
                let canonical = path.canonicalize().unwrap_or(path);
                if !found.contains(&canonical) {
                    found.push(canonical);
                }
            }
        }
    }
    found
}

/// Python site-packages directories that exist on this machine, most specific first.
pub fn site_packages() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    if let Some(venv) = std::env::var_os("VIRTUAL_ENV") {
        prefixes.push(venv.into());
    }
    let mut starts: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        starts.push(cwd);
    }
    if let Ok(exe) = std::env::current_exe() {
        starts.extend(exe.parent().map(Path::to_path_buf));
    }
    for start in &starts {
        prefixes.extend(
            start
                .ancestors()
                .map(|dir| dir.join(".venv"))
                .filter(|d| d.is_dir()),
        );
    }
    if let Some(home) = std::env::var_os("HOME").map(PathBuf::from) {
        prefixes.push(home.join(".local"));
        let pyenv =
            std::env::var_os("PYENV_ROOT").map_or_else(|| home.join(".pyenv"), PathBuf::from);
        prefixes.extend(sorted_children(&pyenv.join("versions")));
    }
    prefixes.push("/usr/local".into());
    prefixes.push("/usr".into());

    let mut dirs: Vec<PathBuf> = Vec::new();
    for prefix in prefixes {
        for lib in ["lib", "lib64", "local/lib"] {
            for python in sorted_children(&prefix.join(lib)) {
                let is_python = python
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("python3"));
                if !is_python {
                    continue;
                }
                for packages in ["site-packages", "dist-packages"] {
                    let dir = python.join(packages);
                    if dir.is_dir() && !dirs.contains(&dir) {
                        dirs.push(dir);
                    }
                }
            }
        }
    }
    dirs
}

fn sorted_children(dir: &Path) -> Vec<PathBuf> {
    let mut children: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| entries.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    children.sort();
    children
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = resolve(Some("quantum")).unwrap_err().to_string();
        assert!(
            err.contains("unknown PJRT plugin `quantum`") && err.contains("cpu, tpu, cuda"),
            "{err}"
        );
    }

    #[test]
    fn the_environment_names_the_default_plugin() {
        std::env::set_var(PLUGIN_ENV, "/nonexistent/from-env/libpjrt.so");
        let err = resolve(None).unwrap_err().to_string();
        std::env::remove_var(PLUGIN_ENV);
        assert!(err.contains("/nonexistent/from-env/libpjrt.so"), "{err}");
    }

    #[test]
    fn directories_given_first_are_searched() {
        let dir = tempfile::tempdir().unwrap();
        let library = dir.path().join("fastatomstruct_xla_cpu/libpjrt_cpu.so");
        std::fs::create_dir_all(library.parent().unwrap()).unwrap();
        std::fs::write(&library, b"not really a plugin").unwrap();
        let found = resolve_in(Some("cpu"), &[dir.path().to_path_buf()]).unwrap();
        assert_eq!(found, library.canonicalize().unwrap());
    }

    #[test]
    fn kinds_follow_the_library_names() {
        for known in KNOWN_PLUGINS {
            for library in known.libraries {
                let kind = PluginKind::of(Path::new(library));
                let expected = match known.name {
                    "cpu" => PluginKind::Cpu,
                    "tpu" => PluginKind::Tpu,
                    _ => PluginKind::Cuda,
                };
                assert_eq!(kind, expected, "{library}");
            }
        }
        assert_eq!(
            PluginKind::of(Path::new("/opt/libother.so")),
            PluginKind::Other
        );
        assert!(PluginKind::Cpu.takes_device_count() && !PluginKind::Tpu.takes_device_count());
    }

    #[test]
    fn a_missing_path_is_named() {
        let err = resolve(Some("/nonexistent/libpjrt.so"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/nonexistent/libpjrt.so") && err.contains("no such file"),
            "{err}"
        );
    }
}
