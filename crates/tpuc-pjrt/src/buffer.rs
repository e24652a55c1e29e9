//! Device buffers.
use crate::client::ClientInner;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::host::{HostBytes, HostTensor};
use crate::plugin::{pjrt_call, raw_slice};
use crate::DType;
use pjrt_sys::*;
use std::sync::Arc;

/// A buffer on a device. Dropping it frees the device memory.
pub struct Buffer {
    pub(crate) raw: *mut PJRT_Buffer,
    client: Arc<ClientInner>,
    /// Host memory the buffer may alias, and the event that fires once the plugin is done with it.
    shared_host: Option<(Arc<dyn HostBytes>, *mut PJRT_Event)>,
    /// The device (its PJRT handle) and the bytes counted in the client's memory use while the
    /// buffer lives; None where the plugin did not say.
    counted: Option<(usize, usize)>,
}

// SAFETY: PJRT buffers may be used and freed from any thread; the shared host memory is
// `Send + Sync` and never written through the buffer.
unsafe impl Send for Buffer {}
unsafe impl Sync for Buffer {}

impl Buffer {
    pub(crate) fn new(
        raw: *mut PJRT_Buffer,
        client: &Arc<ClientInner>,
        shared_host: Option<(Arc<dyn HostBytes>, *mut PJRT_Event)>,
    ) -> Self {
        let mut buffer = Buffer {
            raw,
            client: client.clone(),
            shared_host,
            counted: None,
        };
        if let (Ok(device), Ok(bytes)) = (buffer.device_handle(), buffer.on_device_size()) {
            let device = device as usize;
            client.memory.add(device, bytes);
            buffer.counted = Some((device, bytes));
        }
        buffer
    }

    /// Hands the host memory this buffer aliases to `to`, a result that took this (donated)
    /// buffer's memory: this buffer's handle is destroyed now, and `to` keeps the memory alive
    /// and waits for the plugin to be done with it when it goes.
    pub(crate) fn hand_host_to(mut self, to: &mut Buffer) {
        to.shared_host = self.shared_host.take();
    }

    pub(crate) fn belongs_to(&self, client: &Arc<ClientInner>) -> bool {
        Arc::ptr_eq(&self.client, client)
    }

    /// The PJRT handle, for calling the C API directly (the buffer still owns it).
    pub fn raw(&self) -> *mut PJRT_Buffer {
        self.raw
    }

    pub fn element_type(&self) -> Result<DType> {
        let mut args = PJRT_Buffer_ElementType_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Buffer_ElementType, &mut args)?;
        crate::element_type::from_raw(args.type_).ok_or_else(|| {
            Error::Invalid(format!(
                "buffer has an element type tpuc does not handle (PJRT type {})",
                args.type_
            ))
        })
    }

    pub fn dims(&self) -> Result<Vec<i64>> {
        let mut args = PJRT_Buffer_Dimensions_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Buffer_Dimensions, &mut args)?;
        // SAFETY: the dimensions live as long as the buffer.
        Ok(unsafe { raw_slice(args.dims, args.num_dims) }.to_vec())
    }

    pub fn on_device_size(&self) -> Result<usize> {
        let mut args = PJRT_Buffer_OnDeviceSizeInBytes_Args::new();
        args.buffer = self.raw;
        pjrt_call!(
            self.client.plugin,
            PJRT_Buffer_OnDeviceSizeInBytes,
            &mut args
        )?;
        Ok(args.on_device_size_in_bytes)
    }

    pub fn device(&self) -> Result<Device> {
        Ok(Device {
            raw: self.device_handle()?,
            client: self.client.clone(),
        })
    }

    /// The PJRT handle of the buffer's device.
    fn device_handle(&self) -> Result<*mut PJRT_Device> {
        let mut args = PJRT_Buffer_Device_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Buffer_Device, &mut args)?;
        Ok(args.device)
    }

    /// The address of the buffer's data in device memory (on the CPU plugin, a host address).
    pub fn device_address(&self) -> Result<usize> {
        let mut args = PJRT_Buffer_UnsafePointer_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Buffer_UnsafePointer, &mut args)?;
        Ok(args.buffer_pointer)
    }

    /// Waits until the buffer's contents are computed; returns the error that produced it, if any.
    pub fn ready(&self) -> Result<()> {
        let mut args = PJRT_Buffer_ReadyEvent_Args::new();
        args.buffer = self.raw;
        pjrt_call!(self.client.plugin, PJRT_Buffer_ReadyEvent, &mut args)?;
        Event::new(&self.client.plugin, args.event).wait()
    }

    /// Copies the buffer to the host.
    pub fn to_host(&self) -> Result<HostTensor> {
        let mut tensor = HostTensor::zeros(self.element_type()?, &self.dims()?)?;
        self.copy_to_host(tensor.bytes_mut())?;
        Ok(tensor)
    }

    /// Copies the buffer into `dst`, which must be exactly its dense size.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        let mut args = PJRT_Buffer_ToHostBuffer_Args::new();
        args.src = self.raw;
        args.dst = dst.as_mut_ptr().cast();
        args.dst_size = dst.len();
        pjrt_call!(self.client.plugin, PJRT_Buffer_ToHostBuffer, &mut args)?;
        Event::new(&self.client.plugin, args.event).wait()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args = PJRT_Buffer_Destroy_Args::new();
        args.buffer = self.raw;
        let _ = pjrt_call!(self.client.plugin, PJRT_Buffer_Destroy, &mut args);
        if let Some((device, bytes)) = self.counted {
            self.client.memory.remove(device, bytes);
        }
        if let Some((host, done)) = self.shared_host.take() {
            // The host memory may be freed only once the plugin is done with it.
            let _ = Event::new(&self.client.plugin, done).wait();
            drop(host);
        }
    }
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.element_type(), self.dims()) {
            (Ok(t), Ok(d)) => write!(f, "Buffer({t} {d:?})"),
            _ => write!(f, "Buffer({:p})", self.raw),
        }
    }
}
