//! Where a pipe's work runs: its context (the device's primary context, or a green context of
//! the SMs `STOKER_GPU_DECODE_SMS` asks for, one per pipe since a green context may be current
//! on one thread only), the crop kernel loaded there, and the events its batches' rows are
//! ready by, made there and reused, so a batch creates none.

use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys, DriverError};

use crate::cuda::{in_context, Cuda, GreenContext};
use crate::decode::kernel;
use crate::decode::GpuDecodeError;

/// A pipe's context: the primary one, or a green context of its own.
pub(in crate::decode::lane) struct Place {
    cuda: Arc<Cuda>,
    green: Option<GreenContext>,
}

impl Place {
    /// The primary context of `cuda`'s device, or with `sms` a green context of that many SMs.
    pub(in crate::decode::lane) fn new(
        cuda: &Arc<Cuda>,
        sms: Option<u32>,
    ) -> std::result::Result<Arc<Place>, GpuDecodeError> {
        let green = match sms {
            Some(sms) => Some(GreenContext::new(cuda, sms).map_err(GpuDecodeError::Cuda)?),
            None => None,
        };
        Ok(Arc::new(Place {
            cuda: Arc::clone(cuda),
            green,
        }))
    }

    /// The context the pipe's objects belong to and its thread makes current.
    pub(in crate::decode::lane) fn context(&self) -> sys::CUcontext {
        self.green
            .as_ref()
            .map_or_else(|| self.cuda.context(), GreenContext::context)
    }

    /// SMs the pipe's kernels are kept to, when a green context keeps them.
    pub(in crate::decode::lane) fn sms(&self) -> Option<u32> {
        self.green.as_ref().map(GreenContext::sms)
    }

    /// Runs `f` with the pipe's context current (see [`crate::cuda::in_context`]).
    pub(in crate::decode::lane) fn run<T>(
        &self,
        f: impl FnOnce() -> Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        in_context(self.context(), f)
    }

    /// A non-blocking stream of the pipe's context at `priority`.
    pub(in crate::decode::lane) fn stream(
        &self,
        priority: i32,
    ) -> Result<sys::CUstream, DriverError> {
        match &self.green {
            Some(green) => green.stream(priority),
            None => self.run(|| {
                result::stream::create_with_priority(
                    result::stream::StreamKind::NonBlocking,
                    priority,
                )
            }),
        }
    }
}

/// The crop kernel loaded into one pipe's context.
pub(in crate::decode::lane) struct Kernel {
    module: sys::CUmodule,
    pub(in crate::decode::lane) function: sys::CUfunction,
}

// SAFETY: module and function handles of a context may be used from any thread.
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

impl Kernel {
    /// Compiles the kernel for the device (once per process and architecture) and loads it
    /// into `place`'s context.
    pub(in crate::decode::lane) fn load(
        place: &Place,
        dirs: &[PathBuf],
    ) -> std::result::Result<Kernel, GpuDecodeError> {
        let sm = place
            .cuda
            .compute_capability()
            .map_err(|e| GpuDecodeError::Cuda(e.to_string()))?;
        let image = kernel::compile(dirs, Some(sm))?.image();
        let name =
            CString::new(kernel::KERNEL).map_err(|e| GpuDecodeError::Kernel(e.to_string()))?;
        place
            .run(|| {
                // SAFETY: `image` is a CUBIN (or NUL-terminated PTX) for this device.
                let module = unsafe { result::module::load_data(image.as_ptr().cast::<c_void>()) }?;
                // SAFETY: the module is loaded; the name is NUL-terminated.
                match unsafe { result::module::get_function(module, name) } {
                    Ok(function) => Ok(Kernel { module, function }),
                    Err(error) => {
                        // SAFETY: the module was loaded above and nothing uses it.
                        let _ = unsafe { result::module::unload(module) };
                        Err(error)
                    }
                }
            })
            .map_err(|e| GpuDecodeError::Kernel(crate::cuda::describe(e)))
    }

    /// Unloads the module; the caller has `place`'s context current and no launch from it is
    /// queued any more.
    pub(in crate::decode::lane) fn unload(&mut self) {
        if self.module.is_null() {
            return;
        }
        // SAFETY: as the caller promises; unloaded once (the handle is cleared).
        let _ = unsafe { result::module::unload(self.module) };
        self.module = std::ptr::null_mut();
    }
}

/// A pipe's events, made in its context and reused: each batch's rows carry one
/// ([`ReadyEvent`]), given back when the rows go. The pool outlives the pipe while rows hold
/// its events, and destroys them when the last holder lets go (the pipe's thread has ended
/// then, so its context is current nowhere else).
pub(in crate::decode::lane) struct EventPool {
    place: Arc<Place>,
    free: Mutex<Vec<sys::CUevent>>,
}

// SAFETY: event handles may be used from any thread; the list is behind a lock.
unsafe impl Send for EventPool {}
unsafe impl Sync for EventPool {}

impl EventPool {
    pub(in crate::decode::lane) fn new(place: &Arc<Place>) -> Arc<EventPool> {
        Arc::new(EventPool {
            place: Arc::clone(place),
            free: Mutex::new(Vec::new()),
        })
    }

    /// An event recorded on `stream` after the work queued there so far: one given back
    /// before, or a new one. Called on the pipe's thread, with its context current.
    pub(in crate::decode::lane) fn record(
        self: &Arc<Self>,
        stream: sys::CUstream,
    ) -> Result<ReadyEvent, DriverError> {
        let reused = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let event = match reused {
            Some(event) => event,
            None => {
                let mut event = std::ptr::null_mut();
                // SAFETY: creation into a local, in the pipe's context (current here).
                unsafe {
                    sys::cuEventCreate(
                        &mut event,
                        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                    )
                    .result()?;
                }
                event
            }
        };
        let ready = ReadyEvent {
            event,
            pool: Arc::clone(self),
        };
        // SAFETY: the event and the stream are of the pipe's context; on failure `ready`
        // drops and gives the event back unrecorded (a later record overwrites it).
        unsafe { result::event::record(ready.event, stream) }?;
        Ok(ready)
    }
}

impl Drop for EventPool {
    fn drop(&mut self) {
        let events = std::mem::take(&mut *self.free.lock().unwrap_or_else(|p| p.into_inner()));
        if events.is_empty() {
            return;
        }
        let _ = self.place.run(|| {
            for event in events {
                // SAFETY: each event is the pool's own, passed and held by no one.
                let _ = unsafe { sys::cuEventDestroy_v2(event) };
            }
            Ok(())
        });
    }
}

/// One event of a pipe's [`EventPool`], recorded after a batch's rows were written; back to
/// the pool when dropped.
pub(in crate::decode::lane) struct ReadyEvent {
    event: sys::CUevent,
    pool: Arc<EventPool>,
}

// SAFETY: an event handle may be used from any thread.
unsafe impl Send for ReadyEvent {}
unsafe impl Sync for ReadyEvent {}

impl ReadyEvent {
    /// The event, for a stream of another context to wait on (`cuStreamWaitEvent` takes an
    /// event of any context of the device).
    pub(in crate::decode::lane) fn handle(&self) -> sys::CUevent {
        self.event
    }

    /// Waits on the calling thread until the event has passed. The primary context is made
    /// current for the call, never the pipe's (a green context is current on its pipe's
    /// thread alone).
    pub(in crate::decode::lane) fn synchronize(&self) -> Result<(), DriverError> {
        let event = self.event;
        // SAFETY: the event is live (the pool destroys it only after it is given back).
        in_context(self.pool.place.cuda.context(), || unsafe {
            result::event::synchronize(event)
        })
    }
}

impl Drop for ReadyEvent {
    fn drop(&mut self) {
        self.pool
            .free
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.event);
    }
}
