//! Loading a PJRT plugin: `dlopen`, `GetPjrtApi`, version and function-table checks, one-time
//! initialisation. A plugin is loaded once per process and never unloaded (plugins do not
//! support `dlclose`).
use crate::error::{Error, ErrorCode, Result};
use pjrt_sys::*;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Calls a PJRT function of `$plugin` with `&mut $args`, turning a returned error into [`Error`].
macro_rules! pjrt_call {
    ($plugin:expr, $function:ident, $args:expr) => {{
        let plugin: &$crate::plugin::Plugin = &$plugin;
        // SAFETY: the function comes from the plugin's checked table and `$args` is a
        // zero-initialised argument struct of the matching type with its size set.
        let error = unsafe { (plugin.functions.$function)($args) };
        plugin.check(stringify!($function), error)
    }};
}
pub(crate) use pjrt_call;

/// A loaded PJRT plugin.
pub struct Plugin {
    path: PathBuf,
    pub(crate) functions: Functions,
    version: (i32, i32),
    attributes: Vec<(String, AttributeValue)>,
    /// The function of the shardings extension that reads an executable's output shardings,
    /// when the plugin has it.
    pub(crate) output_shardings: Option<OutputShardingsFn>,
}

pub(crate) type OutputShardingsFn = unsafe extern "C" fn(
    *mut PJRT_Shardings_PJRT_Executable_OutputShardings_Args,
) -> *mut PJRT_Error;

// SAFETY: the function table is immutable after loading, and PJRT's functions may be called from
// any thread.
unsafe impl Send for Plugin {}
unsafe impl Sync for Plugin {}

/// The value of a plugin attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    String(String),
    Int(i64),
    Ints(Vec<i64>),
    Float(f32),
    Bool(bool),
}

impl fmt::Display for AttributeValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttributeValue::String(s) => f.write_str(s),
            AttributeValue::Int(i) => write!(f, "{i}"),
            AttributeValue::Ints(v) => {
                let parts: Vec<String> = v.iter().map(i64::to_string).collect();
                write!(f, "{}", parts.join("."))
            }
            AttributeValue::Float(x) => write!(f, "{x}"),
            AttributeValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

static LOADED: Mutex<Vec<Arc<Plugin>>> = Mutex::new(Vec::new());

impl Plugin {
    /// Loads the plugin at `path`, or returns the one already loaded from that file.
    pub fn load(path: &Path) -> Result<Arc<Plugin>> {
        let load_error = |reason: String| Error::PluginLoad {
            path: path.to_path_buf(),
            reason,
        };
        let canonical = path
            .canonicalize()
            .map_err(|e| load_error(format!("{e}")))?;
        let mut loaded = LOADED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(plugin) = loaded.iter().find(|p| p.path == canonical) {
            return Ok(plugin.clone());
        }
        let plugin = Arc::new(Self::open(&canonical)?);
        loaded.push(plugin.clone());
        Ok(plugin)
    }

    fn open(path: &Path) -> Result<Plugin> {
        let load_error = |reason: String| Error::PluginLoad {
            path: path.to_path_buf(),
            reason,
        };
        prepare_environment(path);
        // SAFETY: loading a shared library runs its initialisers; a PJRT plugin's are benign.
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| load_error(format!("not a loadable shared library ({e})")))?;
        // SAFETY: `GetPjrtApi` takes nothing and returns the table, per the PJRT C API.
        let get_api = unsafe { library.get::<GetPjrtApiFn>(b"GetPjrtApi\0") }.map_err(|_| {
            load_error("not a PJRT plugin: it does not export GetPjrtApi".to_string())
        })?;
        // SAFETY: as above.
        let api = unsafe { get_api() };
        if api.is_null() {
            return Err(load_error("GetPjrtApi returned no function table".into()));
        }
        // SAFETY: `api` points to the plugin's table, which lives as long as the process (the
        // library is never unloaded, see below). Only fields below `struct_size` are read.
        let version = unsafe {
            let header = std::mem::offset_of!(PJRT_Api, pjrt_api_version)
                + std::mem::size_of::<PJRT_Api_Version>();
            if (*api).struct_size < header {
                return Err(load_error(format!(
                    "its function table is {} bytes, too small to be a PJRT API",
                    (*api).struct_size
                )));
            }
            let v = &(*api).pjrt_api_version;
            (v.major_version, v.minor_version)
        };
        if version.0 != PJRT_API_MAJOR {
            return Err(load_error(format!(
                "it implements PJRT API {}.{}, tpuc speaks major version {PJRT_API_MAJOR}",
                version.0, version.1
            )));
        }
        // SAFETY: `api` is live and its `struct_size` bounds what is read.
        let functions =
            unsafe { Functions::from_api(api) }.map_err(|missing| Error::PluginIncomplete {
                path: path.to_path_buf(),
                major: version.0,
                minor: version.1,
                missing,
            })?;
        // Plugins do not support being unloaded: keep the library mapped for the process.
        std::mem::forget(library);
        // SAFETY: `api` is live for the process; the chain is the plugin's.
        let output_shardings = unsafe { output_shardings_of(api) };
        let mut plugin = Plugin {
            path: path.to_path_buf(),
            functions,
            version,
            attributes: Vec::new(),
            output_shardings,
        };
        pjrt_call!(
            plugin,
            PJRT_Plugin_Initialize,
            &mut PJRT_Plugin_Initialize_Args::new()
        )?;
        plugin.attributes = plugin.read_attributes()?;
        Ok(plugin)
    }

    /// Whether the plugin can say how a compiled program lays out its outputs (its shardings
    /// extension), as XLA's partitioner chose for outputs it was left to decide.
    pub fn reads_output_shardings(&self) -> bool {
        self.output_shardings.is_some()
    }

    fn read_attributes(&self) -> Result<Vec<(String, AttributeValue)>> {
        let mut args = PJRT_Plugin_Attributes_Args::new();
        pjrt_call!(self, PJRT_Plugin_Attributes, &mut args)?;
        // SAFETY: the plugin returns `num_attributes` values that live as long as the process.
        let values = unsafe { raw_slice(args.attributes, args.num_attributes) };
        Ok(values.iter().map(|v| unsafe { named_value(v) }).collect())
    }

    /// The plugin's functions, for calling the C API directly.
    pub fn functions(&self) -> &Functions {
        &self.functions
    }

    /// The file the plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The PJRT C API version the plugin implements, `(major, minor)`.
    pub fn api_version(&self) -> (i32, i32) {
        self.version
    }

    /// Attributes the plugin reports (`xla_version`, `stablehlo_current_version`, ...).
    pub fn attributes(&self) -> &[(String, AttributeValue)] {
        &self.attributes
    }

    /// One attribute by name.
    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    /// Turns an error returned by `call` into [`Error::Pjrt`] and frees it.
    pub(crate) fn check(&self, call: &'static str, error: *mut PJRT_Error) -> Result<()> {
        if error.is_null() {
            return Ok(());
        }
        let mut message = PJRT_Error_Message_Args::new();
        message.error = error;
        let mut code = PJRT_Error_GetCode_Args::new();
        code.error = error;
        let mut destroy = PJRT_Error_Destroy_Args::new();
        destroy.error = error;
        // SAFETY: `error` is a live error the plugin returned; it is destroyed exactly once, after
        // its message has been copied.
        unsafe {
            (self.functions.PJRT_Error_Message)(&mut message);
            let text = string_from(message.message, message.message_size);
            let code_error = (self.functions.PJRT_Error_GetCode)(&mut code);
            let code = if code_error.is_null() {
                ErrorCode::from_raw(code.code)
            } else {
                ErrorCode::Unknown
            };
            (self.functions.PJRT_Error_Destroy)(&mut destroy);
            Err(Error::Pjrt {
                call,
                code,
                message: text,
            })
        }
    }
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("api_version", &self.version)
            .finish()
    }
}

/// Environment a plugin needs before it initialises (set before the plugin starts any thread
/// that could read the environment).
/// - libtpu queries the GCE metadata server for minutes on a machine that is not a Cloud TPU VM
///   unless told not to.
/// - XLA logs informational lines (its start-up, the device count it was given) on every first
///   use; a library is quiet unless asked: warnings and errors only, unless the user sets
///   `TF_CPP_MIN_LOG_LEVEL` (0 for everything).
/// - XLA:CPU's own defaults where they change results: see [`cpu_plugin_flags`].
fn prepare_environment(path: &Path) {
    const LOG_LEVEL: &str = "TF_CPP_MIN_LOG_LEVEL";
    let kind = crate::discover::PluginKind::of(path);
    if kind == crate::discover::PluginKind::Tpu && std::env::var_os("TPU_SKIP_MDS_QUERY").is_none()
    {
        std::env::set_var("TPU_SKIP_MDS_QUERY", "1");
    }
    if std::env::var_os(LOG_LEVEL).is_none() {
        std::env::set_var(LOG_LEVEL, "1");
    }
    if kind == crate::discover::PluginKind::Cpu {
        let flags = std::env::var("XLA_FLAGS").unwrap_or_default();
        let flags = cpu_plugin_flags(&flags, crate::host_cpu::description());
        std::env::set_var("XLA_FLAGS", flags);
    }
}

/// `XLA_FLAGS` for the CPU plugin: the user's flags, then tpuc's where the user set none of
/// that name (the user's setting wins).
/// - XLA:CPU's minimum and maximum (elementwise, reductions, max pooling) drop NaN unless its
///   fast min/max is turned off; torch propagates NaN.
/// - On a CPU with float16 instructions (`avx512_fp16`), XLA:CPU's code computes 16-bit floats
///   natively and its results differ from those of every other CPU (and torch's) by a 16-bit
///   ulp where a product feeds a sum; capped at AVX2, it computes them as elsewhere. tpuc's
///   modules compute 16-bit arithmetic in float32 (`passes::narrow_arithmetic`), but LLVM
///   narrows such steps back to 16-bit instructions where that is exact for the step alone.
fn cpu_plugin_flags(user: &str, host_cpu: &str) -> String {
    let mut flags = vec![user.trim().to_string()];
    let mut default = |name: &str, value: &str| {
        if !user.contains(name) {
            flags.push(format!("--{name}={value}"));
        }
    };
    default("xla_cpu_enable_fast_min_max", "false");
    if crate::host_cpu::has_feature(host_cpu, "avx512_fp16") {
        default("xla_cpu_max_isa", "AVX2");
    }
    flags.retain(|f| !f.is_empty());
    flags.join(" ")
}

/// A slice the plugin owns; empty for a null pointer.
///
/// # Safety
/// `ptr` must point to `len` valid values that outlive the returned slice.
pub(crate) unsafe fn raw_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if ptr.is_null() || len == 0 {
        &[]
    } else {
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

/// Copies a (pointer, length) string the plugin returned.
///
/// # Safety
/// `ptr` must point to `len` readable bytes.
pub(crate) unsafe fn string_from(ptr: *const std::ffi::c_char, len: usize) -> String {
    let bytes = unsafe { raw_slice(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

#[allow(non_upper_case_globals)]
/// # Safety
/// `value` must be a named value the plugin filled in, its pointers valid.
pub(crate) unsafe fn named_value(value: &PJRT_NamedValue) -> (String, AttributeValue) {
    unsafe {
        let name = string_from(value.name, value.name_size);
        let v = match value.type_ {
            PJRT_NamedValue_kString => {
                AttributeValue::String(string_from(value.value.string_value, value.value_size))
            }
            PJRT_NamedValue_kInt64 => AttributeValue::Int(value.value.int64_value),
            PJRT_NamedValue_kInt64List => AttributeValue::Ints(
                raw_slice(value.value.int64_array_value, value.value_size).to_vec(),
            ),
            PJRT_NamedValue_kFloat => AttributeValue::Float(value.value.float_value),
            PJRT_NamedValue_kBool => AttributeValue::Bool(value.value.bool_value),
            other => AttributeValue::String(format!("<value of unknown type {other}>")),
        };
        (name, v)
    }
}

/// The output-shardings function of the shardings extension in the chain `api` advertises.
///
/// # Safety
/// `api` must point to a live PJRT function table whose extension chain is well formed.
unsafe fn output_shardings_of(api: *const PJRT_Api) -> Option<OutputShardingsFn> {
    let mut extension = (*api).extension_start;
    while !extension.is_null() {
        let base = &*extension;
        if base.type_ == PJRT_Extension_Type_Shardings
            && base.struct_size >= std::mem::size_of::<PJRT_Shardings_Extension>()
        {
            let shardings = &*(extension as *const PJRT_Shardings_Extension);
            return shardings.PJRT_Shardings_PJRT_Executable_OutputShardings;
        }
        extension = base.next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::cpu_plugin_flags;

    const PLAIN_CPU: &str = "flags\t\t: fpu avx2 avx512f avx512_bf16\nx86_64";
    const FP16_CPU: &str = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_fp16\nx86_64";

    #[test]
    fn nan_propagating_min_max_unless_the_user_says_otherwise() {
        assert_eq!(
            cpu_plugin_flags("", PLAIN_CPU),
            "--xla_cpu_enable_fast_min_max=false"
        );
        assert_eq!(
            cpu_plugin_flags(" --xla_dump_to=/tmp/d ", PLAIN_CPU),
            "--xla_dump_to=/tmp/d --xla_cpu_enable_fast_min_max=false"
        );
        assert_eq!(
            cpu_plugin_flags("--xla_cpu_enable_fast_min_max=true", PLAIN_CPU),
            "--xla_cpu_enable_fast_min_max=true"
        );
    }

    #[test]
    fn a_cpu_with_float16_instructions_is_capped_at_avx2_unless_the_user_chose() {
        assert_eq!(
            cpu_plugin_flags("", FP16_CPU),
            "--xla_cpu_enable_fast_min_max=false --xla_cpu_max_isa=AVX2"
        );
        assert_eq!(
            cpu_plugin_flags("--xla_cpu_max_isa=AVX512", FP16_CPU),
            "--xla_cpu_max_isa=AVX512 --xla_cpu_enable_fast_min_max=false"
        );
        assert!(!cpu_plugin_flags("", PLAIN_CPU).contains("max_isa"));
    }
}
