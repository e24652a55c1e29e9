//! Device buffers handed to torch through DLPack (the legacy, unversioned `dltensor` capsule),
//! without copying: the capsule owns the PJRT buffer (or the host tensor holding part of one)
//! until the consumer's tensor is freed. Only for memory the host can address (the CPU
//! plugin's device memory is host memory).
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};
use tpuc_pjrt::{Buffer, DType, HostTensor};

const CAPSULE_NAME: &CStr = c"dltensor";

/// `kDLCPU`.
const DEVICE_CPU: i32 = 1;

#[repr(C)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    /// Null: compact row-major.
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// The memory a capsule hands over.
pub enum Memory {
    /// A device buffer's own (host-addressable) memory.
    Device(Buffer),
    /// A copy on the host (the leading part of a result computed at a bucket's shape).
    Host(HostTensor),
}

/// What a capsule owns; `managed` comes first so a pointer to it is a pointer to this.
#[repr(C)]
struct Exported {
    managed: DLManagedTensor,
    shape: Vec<i64>,
    _memory: Memory,
}

unsafe extern "C" fn delete_exported(managed: *mut DLManagedTensor) {
    // SAFETY: `managed` is the first field of an `Exported` boxed in `capsule`, deleted once
    // (by the consumer, or by the capsule when nobody consumed it).
    drop(unsafe { Box::from_raw(managed.cast::<Exported>()) });
}

unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    // A consumer renames the capsule it takes ("used_dltensor") and deletes the tensor itself.
    // SAFETY: called by Python with a live capsule object.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, CAPSULE_NAME.as_ptr()) == 1 {
            let managed =
                ffi::PyCapsule_GetPointer(capsule, CAPSULE_NAME.as_ptr()).cast::<DLManagedTensor>();
            if let Some(deleter) = (*managed).deleter {
                deleter(managed);
            }
        }
    }
}

fn data_type(element_type: DType) -> DLDataType {
    // DLPack codes: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLComplex 5, kDLBool 6,
    // kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12.
    let code = match element_type {
        DType::Bool => 6,
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => 0,
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => 1,
        DType::F16 | DType::F32 | DType::F64 => 2,
        DType::BF16 => 4,
        DType::C64 | DType::C128 => 5,
        DType::F8E4M3FN => 10,
        DType::F8E5M2 => 12,
    };
    DLDataType {
        code,
        bits: (element_type.byte_size() * 8) as u8,
        lanes: 1,
    }
}

/// A `dltensor` capsule owning `memory` (a device buffer's must be host-addressable), a dense
/// tensor of the given (known) type and shape.
pub fn capsule<'py>(
    py: Python<'py>,
    memory: Memory,
    element_type: DType,
    shape: &[i64],
) -> PyResult<Bound<'py, PyAny>> {
    let shape = shape.to_vec();
    let address = match &memory {
        Memory::Device(buffer) => buffer.device_address().map_err(super::error)?,
        Memory::Host(tensor) => tensor.bytes().as_ptr() as usize,
    };
    let mut exported = Box::new(Exported {
        managed: DLManagedTensor {
            dl_tensor: DLTensor {
                data: address as *mut c_void,
                device: DLDevice {
                    device_type: DEVICE_CPU,
                    device_id: 0,
                },
                ndim: shape.len() as i32,
                dtype: data_type(element_type),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported),
        },
        shape,
        _memory: memory,
    });
    // The shape lives in the same box, which does not move.
    exported.managed.dl_tensor.shape = exported.shape.as_mut_ptr();
    let managed = Box::into_raw(exported).cast::<c_void>();
    // SAFETY: `managed` points to a boxed `Exported`; the capsule's destructor frees it unless
    // a consumer took it over.
    unsafe {
        let object = ffi::PyCapsule_New(managed, CAPSULE_NAME.as_ptr(), Some(destroy_capsule));
        if object.is_null() {
            delete_exported(managed.cast());
            return Err(PyErr::fetch(py));
        }
        Ok(Bound::from_owned_ptr(py, object))
    }
}
