//! The C interface of the runtime that the native device (the C++ PrivateUse1 layer, `native/`)
//! calls on its per-op path, where no Python runs: a table of functions (`NativeApi`) handed over
//! once as a capsule (`native_api`), and handles to what it holds between calls: a value on a
//! device (`Box<DeviceValue>`), a program loaded on the device (`Arc<Loaded>`), a target to upload
//! to (`Arc<Target>`). Python gives the device the handles of what it compiled and uploaded on a
//! cache miss (`CompiledGraph.native_handle`, `DeviceBuffer.native_handle`) and makes buffers of
//! the device's values (`DeviceBuffer.from_native`).
//!
//! Every function returns null on success or an error message the caller frees with
//! `free_error`; none unwinds into C++.
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use tpuc_driver::{Call, DeviceValue, Input, Loaded, Target};
use tpuc_pjrt::DType;

/// The version of `NativeApi`'s layout; the C++ layer refuses a table of another.
const ABI_VERSION: u32 = 2;
const API_CAPSULE: &std::ffi::CStr = c"tpuc._tpuc.NativeApi";
const VALUE_CAPSULE: &std::ffi::CStr = c"tpuc._tpuc.DeviceValue";
const PROGRAM_CAPSULE: &std::ffi::CStr = c"tpuc._tpuc.Loaded";
const TARGET_CAPSULE: &std::ffi::CStr = c"tpuc._tpuc.Target";

type Error = *mut c_char;

/// The functions of the runtime the C++ layer calls (layout mirrored in `native/runtime.h`).
#[repr(C)]
pub struct NativeApi {
    abi_version: u32,
    /// A new value on the target's device `device` (0 for a target of one device): `nbytes`
    /// bytes at `data` (dense, row-major) of element type `dtype` (an index of `DType::ALL`,
    /// `element_types`) and the `rank` sizes at `dims`.
    upload: unsafe extern "C" fn(
        target: *const Target,
        device: usize,
        dtype: u32,
        dims: *const i64,
        rank: usize,
        data: *const u8,
        nbytes: usize,
        out: *mut *mut DeviceValue,
    ) -> Error,
    /// Copies a value (whole on one device) into `nbytes` bytes at `dst`, waiting for it.
    download: unsafe extern "C" fn(value: *const DeviceValue, dst: *mut u8, nbytes: usize) -> Error,
    /// Runs `program` on device `device` (0 for a target of one device) on `inputs` (and
    /// `seed`, null for a program without random ops), starting it without waiting: its
    /// `n_outputs` results are written to `outputs`.
    run: unsafe extern "C" fn(
        program: *const Loaded,
        device: usize,
        inputs: *const *const DeviceValue,
        n_inputs: usize,
        seed: *const DeviceValue,
        outputs: *mut *mut DeviceValue,
        n_outputs: usize,
    ) -> Error,
    /// Waits for everything started on the target's devices; the first error since the last call.
    synchronize: unsafe extern "C" fn(target: *const Target) -> Error,
    clone_value: unsafe extern "C" fn(value: *const DeviceValue) -> *mut DeviceValue,
    release_value: unsafe extern "C" fn(value: *mut DeviceValue),
    clone_program: unsafe extern "C" fn(program: *const Loaded) -> *const Loaded,
    release_program: unsafe extern "C" fn(program: *const Loaded),
    clone_target: unsafe extern "C" fn(target: *const Target) -> *const Target,
    release_target: unsafe extern "C" fn(target: *const Target),
    free_error: unsafe extern "C" fn(error: Error),
}

static API: NativeApi = NativeApi {
    abi_version: ABI_VERSION,
    upload,
    download,
    run,
    synchronize,
    clone_value,
    release_value,
    clone_program: clone_shared::<Loaded>,
    release_program: release_shared::<Loaded>,
    clone_target: clone_shared::<Target>,
    release_target: release_shared::<Target>,
    free_error,
};

/// An error for C++: its message, owned by the caller until `free_error`.
fn message(text: impl std::fmt::Display) -> Error {
    let text = text.to_string().replace('\0', " ");
    CString::new(text).map_or(std::ptr::null_mut(), CString::into_raw)
}

/// `body`'s error as a message, a panic included (none crosses into C++).
fn guarded(body: impl FnOnce() -> Result<(), String>) -> Error {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => std::ptr::null_mut(),
        Ok(Err(text)) => message(text),
        Err(_) => message("tpuc's runtime panicked (a bug in tpuc)"),
    }
}

unsafe extern "C" fn upload(
    target: *const Target,
    device: usize,
    dtype: u32,
    dims: *const i64,
    rank: usize,
    data: *const u8,
    nbytes: usize,
    out: *mut *mut DeviceValue,
) -> Error {
    guarded(|| {
        // SAFETY: the C++ layer passes a target handle it holds, `rank` sizes at `dims` and
        // `nbytes` readable bytes at `data`, unchanged during the call.
        let target = unsafe { &*target };
        let dims = unsafe { crate::host_slice(dims, rank) };
        let bytes = unsafe { crate::host_bytes(data as usize, nbytes) };
        let elem = *DType::ALL
            .get(dtype as usize)
            .ok_or_else(|| format!("no element type {dtype}"))?;
        let on = target.each_device().get(device).ok_or_else(|| {
            format!(
                "no device {device}: the runtime has {}",
                target.each_device().len()
            )
        })?;
        let buffer = target
            .client()
            .buffer_from_bytes(elem, dims, bytes, on)
            .map_err(|e| e.to_string())?;
        // SAFETY: `out` is writable.
        unsafe { *out = Box::into_raw(Box::new(DeviceValue::new(vec![buffer]))) };
        Ok(())
    })
}

unsafe extern "C" fn download(value: *const DeviceValue, dst: *mut u8, nbytes: usize) -> Error {
    guarded(|| {
        // SAFETY: a value handle the caller holds; `nbytes` writable bytes at `dst`.
        let value = unsafe { &*value };
        let dst = unsafe { crate::host_bytes_mut(dst as usize, nbytes) };
        let buffer = value.single().map_err(|e| e.to_string())?;
        buffer.copy_to_host(dst).map_err(|e| e.to_string())
    })
}

unsafe extern "C" fn run(
    program: *const Loaded,
    device: usize,
    inputs: *const *const DeviceValue,
    n_inputs: usize,
    seed: *const DeviceValue,
    outputs: *mut *mut DeviceValue,
    n_outputs: usize,
) -> Error {
    guarded(|| {
        // SAFETY: handles the caller holds; `n_inputs` value handles at `inputs`, room for
        // `n_outputs` handles at `outputs`.
        let program = unsafe { &*program };
        let inputs = unsafe { crate::host_slice(inputs, n_inputs) };
        let call = Call {
            inputs: inputs
                .iter()
                .map(|&value| Input::Device(unsafe { &*value }.clone()))
                .collect(),
            seed: (!seed.is_null()).then(|| unsafe { &*seed }.clone()),
        };
        let results = program.launch_on(device, call).map_err(|e| e.to_string())?;
        if results.len() != n_outputs {
            return Err(format!(
                "the program has {} results, {n_outputs} expected",
                results.len()
            ));
        }
        for (i, value) in results.into_iter().enumerate() {
            // SAFETY: room for `n_outputs` handles.
            unsafe { *outputs.add(i) = Box::into_raw(Box::new(value)) };
        }
        Ok(())
    })
}

unsafe extern "C" fn synchronize(target: *const Target) -> Error {
    // SAFETY: a target handle the caller holds.
    guarded(|| {
        unsafe { &*target }
            .client()
            .synchronize()
            .map_err(|e| e.to_string())
    })
}

unsafe extern "C" fn clone_value(value: *const DeviceValue) -> *mut DeviceValue {
    // SAFETY: a value handle the caller holds.
    Box::into_raw(Box::new(unsafe { &*value }.clone()))
}

unsafe extern "C" fn release_value(value: *mut DeviceValue) {
    if !value.is_null() {
        // SAFETY: a handle made by `Box::into_raw` here, released once.
        drop(unsafe { Box::from_raw(value) });
    }
}

/// Another strong reference to a handle made by `Arc::into_raw` (a program's, a target's).
unsafe extern "C" fn clone_shared<T>(handle: *const T) -> *const T {
    // SAFETY: a handle made by `Arc::into_raw` here, still held.
    unsafe { Arc::increment_strong_count(handle) };
    handle
}

/// Releases one strong reference of a handle made by `Arc::into_raw`.
unsafe extern "C" fn release_shared<T>(handle: *const T) {
    if !handle.is_null() {
        // SAFETY: a handle made by `Arc::into_raw` here, released once.
        unsafe { Arc::decrement_strong_count(handle) };
    }
}

unsafe extern "C" fn free_error(error: Error) {
    if !error.is_null() {
        // SAFETY: made by `CString::into_raw` in `message`.
        drop(unsafe { CString::from_raw(error) });
    }
}

/// The table of the runtime's C functions, for the native device.
#[pyfunction]
pub(crate) fn native_api(py: Python<'_>) -> PyResult<Bound<'_, PyCapsule>> {
    let pointer = std::ptr::from_ref(&API).cast_mut().cast();
    raw_capsule(py, pointer, API_CAPSULE, None)
}

/// The element type names in the order the native device's codes number them (an index of
/// this list is the code `upload` takes).
#[pyfunction]
pub(crate) fn element_types() -> Vec<&'static str> {
    DType::ALL.iter().map(|d| d.name()).collect()
}

/// A capsule holding one reference to a handle of kind `H` (made by `into_raw`); the C++ layer
/// takes its own with the matching `clone_*` function. The capsule's destructor releases the one
/// it holds.
fn handle_capsule<'py, H: Handle>(
    py: Python<'py>,
    pointer: *mut std::ffi::c_void,
) -> PyResult<Bound<'py, PyCapsule>> {
    raw_capsule(py, pointer, H::NAME, Some(release_capsule::<H>))
}

/// A capsule of `pointer` named `name` (a static name, as capsules require).
fn raw_capsule<'py>(
    py: Python<'py>,
    pointer: *mut std::ffi::c_void,
    name: &'static std::ffi::CStr,
    destructor: Option<pyo3::ffi::PyCapsule_Destructor>,
) -> PyResult<Bound<'py, PyCapsule>> {
    if pointer.is_null() {
        return Err(crate::error("a null handle"));
    }
    // SAFETY: a non-null pointer valid until the destructor (if any) releases it; the name is
    // static.
    unsafe {
        let capsule = pyo3::ffi::PyCapsule_New(pointer, name.as_ptr(), destructor);
        Ok(Bound::from_owned_ptr_or_err(py, capsule)?.cast_into_unchecked())
    }
}

/// The pointer a capsule of `name` holds.
fn capsule_pointer(
    capsule: &Bound<'_, PyAny>,
    name: &std::ffi::CStr,
) -> PyResult<*mut std::ffi::c_void> {
    let capsule = capsule.cast::<PyCapsule>()?;
    let found = capsule.pointer_checked(Some(name))?;
    Ok(found.as_ptr())
}

/// What a capsule's destructor releases its handle with.
trait Handle {
    const NAME: &'static std::ffi::CStr;
    /// # Safety
    /// `pointer` is a handle of this kind, released once.
    unsafe fn release(pointer: *mut std::ffi::c_void);
}

impl Handle for DeviceValue {
    const NAME: &'static std::ffi::CStr = VALUE_CAPSULE;
    unsafe fn release(pointer: *mut std::ffi::c_void) {
        // SAFETY: as the caller promises.
        unsafe { release_value(pointer.cast()) }
    }
}

impl Handle for Loaded {
    const NAME: &'static std::ffi::CStr = PROGRAM_CAPSULE;
    unsafe fn release(pointer: *mut std::ffi::c_void) {
        // SAFETY: as the caller promises.
        unsafe { release_shared::<Loaded>(pointer.cast()) }
    }
}

impl Handle for Target {
    const NAME: &'static std::ffi::CStr = TARGET_CAPSULE;
    unsafe fn release(pointer: *mut std::ffi::c_void) {
        // SAFETY: as the caller promises.
        unsafe { release_shared::<Target>(pointer.cast()) }
    }
}

/// The destructor of a capsule holding a handle of kind `H`.
unsafe extern "C" fn release_capsule<H: Handle>(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: called by Python on a capsule made by `handle_capsule` with this kind's name.
    let pointer = unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule, H::NAME.as_ptr()) };
    if !pointer.is_null() {
        unsafe { H::release(pointer) };
    }
}

/// A capsule of a handle to `value` (its own reference).
pub(crate) fn value_capsule<'py>(
    py: Python<'py>,
    value: &DeviceValue,
) -> PyResult<Bound<'py, PyCapsule>> {
    let pointer = Box::into_raw(Box::new(value.clone()));
    handle_capsule::<DeviceValue>(py, pointer.cast())
}

/// The value a capsule of `value_capsule` (or the C++ layer's) holds, as a new reference.
pub(crate) fn value_of_capsule(capsule: &Bound<'_, PyAny>) -> PyResult<DeviceValue> {
    let pointer = capsule_pointer(capsule, VALUE_CAPSULE)?;
    // SAFETY: a capsule of this name holds a live `Box<DeviceValue>`.
    Ok(unsafe { &*pointer.cast::<DeviceValue>() }.clone())
}

/// A capsule of a handle to `program`.
pub(crate) fn program_capsule<'py>(
    py: Python<'py>,
    program: &Arc<Loaded>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let pointer = Arc::into_raw(program.clone()).cast_mut();
    handle_capsule::<Loaded>(py, pointer.cast())
}

/// A capsule of a handle to `target`.
pub(crate) fn target_capsule<'py>(
    py: Python<'py>,
    target: &Arc<Target>,
) -> PyResult<Bound<'py, PyCapsule>> {
    let pointer = Arc::into_raw(target.clone()).cast_mut();
    handle_capsule::<Target>(py, pointer.cast())
}
