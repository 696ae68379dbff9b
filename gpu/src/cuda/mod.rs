//! The CUDA driver, loaded at run time through cudarc: page-locking the slot pool's memory
//! once, and fences that keep a slot out of the pool until the GPU copies that read it have
//! finished. Nothing here needs CUDA to build, and without a driver [`Cuda::open`] says what is
//! missing instead of failing later.
//!
//! Stoker shares the device's *primary* context with the framework in the same process (torch's
//! runtime API uses it too), so memory registered here is pinned for torch as well
//! (`Tensor.is_pinned()`), and events recorded here may be recorded on torch's streams.
//!
//! A fence is an event recorded on a stream after the copies that read a slot were queued
//! there. [`Cuda::release_after`] hands the slot's last reference to one thread per device,
//! which waits for the fences (blocking-sync events: the thread sleeps, it does not spin a
//! core) and only then drops the reference, so the slot returns to the pool after the copies,
//! never under one.
//!
//! A batch handed to the user may be copied on any stream by any thread before it is dropped,
//! so its release also asks for a *sweep* ([`Cuda::sweep`]): the fence thread records a fence
//! on every stream registered for the device ([`Cuda::watch_streams`]: torch's stream pool,
//! which every `torch.cuda.Stream()` comes from) and on the legacy default stream, and waits for
//! them all. Recorded later than the release, such a fence covers every copy queued before it
//! (and perhaps more work, which only delays the slot). The fence thread runs in the relaxed
//! stream-capture mode, so its calls never break a CUDA graph another thread is capturing; a
//! stream under capture is fenced once its capture has ended (work queued on it before the
//! capture began is still in its queue then).

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crossbeam_channel::Sender;
use cudarc::driver::{result, sys, DriverError};

mod green;
mod sweep;
pub use green::{sms_asked, GreenContext, SMS_VARIABLE as GREEN_SMS_VARIABLE};
pub use sweep::Sweep;
use sweep::{new_event, reclaim, Deferred};

/// Why the CUDA driver cannot be used here; the message names what is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// `libcuda.so` (the NVIDIA driver's user-space library) cannot be loaded.
    #[error("no CUDA driver: the NVIDIA driver's library (libcuda.so.1) cannot be loaded on this machine")]
    NoDriver,
    /// `cuInit` failed (driver too old for this build, no device visible, a broken install).
    #[error("the CUDA driver did not start (cuInit: {0})")]
    Init(String),
    /// The driver sees fewer devices than the ordinal asked for.
    #[error("no CUDA device {ordinal}: the driver sees {count}")]
    NoDevice {
        /// The device asked for.
        ordinal: usize,
        /// Devices the driver sees.
        count: usize,
    },
    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {error}")]
    Call {
        /// Which call.
        call: &'static str,
        /// The driver's error.
        error: String,
    },
}

fn call_failed(call: &'static str, error: DriverError) -> Unavailable {
    Unavailable::Call {
        call,
        error: describe(error),
    }
}

/// A driver error as its name and text (`CUDA_ERROR_INVALID_VALUE: invalid argument`).
pub(crate) fn describe(error: DriverError) -> String {
    let name = error
        .error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", error.0));
    match error.error_string() {
        Ok(text) => format!("{name}: {}", text.to_string_lossy()),
        Err(_) => name,
    }
}

/// Whether the driver library can be loaded, checked before any other cudarc call (cudarc
/// panics on a missing library; this never does).
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to open the library by its usual names.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// The devices whose primary context is active in this process (torch, or Stoker, has
/// started CUDA on them): the devices a copy may be queued on. Starts no context; empty
/// without a driver or when it does not start.
pub fn active_devices() -> Vec<usize> {
    if !driver_present() || result::init().is_err() {
        return Vec::new();
    }
    let count = result::device::get_count().unwrap_or(0);
    (0..count)
        .filter(|&ordinal| {
            let Ok(device) = result::device::get(ordinal) else {
                return false;
            };
            let (mut flags, mut active) = (0, 0);
            // SAFETY: a plain query of a valid device into locals.
            let state = unsafe { sys::cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) };
            state.result().is_ok() && active != 0
        })
        .filter_map(|ordinal| usize::try_from(ordinal).ok())
        .collect()
}

/// Checks that device `ordinal` can be used (the driver loads and starts, the device exists)
/// without starting its context: what a loader checks when it is built, its slots being
/// page-locked only when the first batch goes out.
pub fn check_device(ordinal: usize) -> Result<(), Unavailable> {
    device_handle(ordinal).map(|_| ())
}

/// The device of the context current on the calling thread (torch makes its current device's
/// context current on the threads that use it), or None. Starts nothing.
pub fn current_device() -> Option<usize> {
    if !driver_present() || result::init().is_err() {
        return None;
    }
    result::ctx::get_current().ok()??;
    let mut device = 0;
    // SAFETY: a plain query of the current context (there is one) into a local.
    unsafe { sys::cuCtxGetDevice(&mut device) }.result().ok()?;
    usize::try_from(device).ok()
}

/// The device whose primary context page-locks a pool's slots when it follows the process's
/// use of the GPUs ([`crate::PinDevice::Follow`]): the one current on the thread taking
/// the first batch, else `fallback` if its context is active, else the first active one, else
/// `fallback`, so that no context is started on a device the process does not use while it
/// uses another.
pub(crate) fn follow_device(current: Option<usize>, active: &[usize], fallback: usize) -> usize {
    current
        .or_else(|| active.contains(&fallback).then_some(fallback))
        .or_else(|| active.first().copied())
        .unwrap_or(fallback)
}

/// The driver started and device `ordinal`'s handle.
fn device_handle(ordinal: usize) -> Result<sys::CUdevice, Unavailable> {
    if !driver_present() {
        return Err(Unavailable::NoDriver);
    }
    result::init().map_err(|e| Unavailable::Init(describe(e)))?;
    let count = result::device::get_count().map_err(|e| call_failed("cuDeviceGetCount", e))?;
    let count = usize::try_from(count).unwrap_or(0);
    if ordinal >= count {
        return Err(Unavailable::NoDevice { ordinal, count });
    }
    result::device::get(ordinal as i32).map_err(|e| call_failed("cuDeviceGet", e))
}

/// One CUDA device's primary context, shared with any framework in the process, retained for
/// the life of the process. Made once per device ([`Cuda::open`]).
pub struct Cuda {
    ordinal: usize,
    context: sys::CUcontext,
    name: String,
    /// The thread that drops references once their fences have completed.
    reclaimer: Sender<Deferred>,
    /// What that thread shares with callers.
    shared: Arc<FenceState>,
}

/// Events no fence uses now, the streams a sweep fences, and counts of the waits.
struct FenceState {
    ordinal: usize,
    context: SendContext,
    free_events: Mutex<Vec<Event>>,
    /// Streams of this context that live as long as the process (torch's pool), fenced by
    /// every sweep besides the legacy default stream; sorted, each once.
    watched: Mutex<Vec<usize>>,
    /// Fences waited for, and those whose wait failed (the reference was dropped anyway: the
    /// device is lost then, and reads nothing more).
    waited: AtomicU64,
    failed: AtomicU64,
}

impl FenceState {
    /// Waits for all work queued on the device's context so far.
    fn synchronize_device(&self) -> Result<(), DriverError> {
        in_context(self.context.0, result::ctx::synchronize)
    }

    fn put_back(&self, event: Event) {
        self.free_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    fn take(&self) -> Option<Event> {
        self.free_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
    }

    /// Waits for one fence of this device, counting it (its event is reused once the fence is
    /// dropped).
    fn wait(&self, kind: FenceKind) {
        let waited = match kind {
            // SAFETY: the event is of this device's context and was recorded; the context is
            // made current for the wait (the fence thread's own may be another device's).
            FenceKind::Event(event) => in_context(self.context.0, || unsafe {
                result::event::synchronize(event.0)
            }),
            FenceKind::Device => self.synchronize_device(),
        };
        self.count(waited);
    }

    /// Counts a wait that is over.
    fn count(&self, waited: Result<(), DriverError>) {
        match waited {
            Ok(()) => {
                self.waited.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                // A failed wait means a lost device: nothing reads the slot any more.
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %describe(error), "a batch slot's fence failed; releasing the slot");
            }
        }
    }
}

// SAFETY: `context` is a handle the driver lets any thread use; the rest is Send + Sync.
unsafe impl Send for Cuda {}
unsafe impl Sync for Cuda {}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cuda")
            .field("ordinal", &self.ordinal)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// An event handle of [`Cuda`]'s context.
#[derive(Debug, Clone, Copy)]
struct Event(sys::CUevent);

// SAFETY: an event handle may be used from any thread.
unsafe impl Send for Event {}

/// A point on a stream: done when the work queued on the stream before it is done; or, when
/// the streams are not known, everything queued on the device so far. A fence may belong to
/// another device than the [`Cuda`] that waits for it ([`Cuda::release_after`]): a batch
/// page-locked through device 0 may be copied to device 1.
pub struct Fence {
    kind: FenceKind,
    /// The device whose context the fence is of.
    device: Arc<FenceState>,
}

impl Drop for Fence {
    /// Puts the fence's event back for reuse, waited for or not (a fence given up on, when
    /// another stream of a release could not be fenced, leaks nothing).
    fn drop(&mut self) {
        if let FenceKind::Event(event) = self.kind {
            self.device.put_back(event);
        }
    }
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fence")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy)]
enum FenceKind {
    Event(Event),
    Device,
}

impl Cuda {
    /// The device `ordinal`'s primary context, retained once per process; the same `Arc` for
    /// every caller. Checks the driver library is there before touching it.
    pub fn open(ordinal: usize) -> Result<Arc<Cuda>, Unavailable> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Cuda>>>> = OnceLock::new();
        let devices = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
        let mut devices = devices.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(cuda) = devices.get(&ordinal) {
            return Ok(Arc::clone(cuda));
        }
        let cuda = Arc::new(Self::start(ordinal)?);
        devices.insert(ordinal, Arc::clone(&cuda));
        Ok(cuda)
    }

    fn start(ordinal: usize) -> Result<Cuda, Unavailable> {
        let device = device_handle(ordinal)?;
        let name = result::device::get_name(device).unwrap_or_else(|_| "?".to_string());
        // SAFETY: `device` is valid; the primary context is retained for the process's life
        // (never released: slot memory registered in it may outlive any one loader).
        let context = unsafe { result::primary_ctx::retain(device) }
            .map_err(|e| call_failed("cuDevicePrimaryCtxRetain", e))?;
        let (sender, receiver) = crossbeam_channel::unbounded();
        let shared = Arc::new(FenceState {
            ordinal,
            context: SendContext(context),
            free_events: Mutex::new(Vec::new()),
            watched: Mutex::new(Vec::new()),
            waited: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("stoker-cuda{ordinal}-fences"))
            .spawn(move || reclaim(thread_shared, receiver))
            .map_err(|e| Unavailable::Call {
                call: "spawning the fence thread",
                error: e.to_string(),
            })?;
        tracing::debug!(ordinal, name = %name, "cuda.open");
        Ok(Cuda {
            ordinal,
            context,
            name,
            reclaimer: sender,
            shared,
        })
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name, as the driver gives it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's compute capability (major, minor).
    pub fn compute_capability(&self) -> Result<(i32, i32), Unavailable> {
        let device =
            result::device::get(self.ordinal as i32).map_err(|e| call_failed("cuDeviceGet", e))?;
        let attribute = |which| {
            // SAFETY: a plain query of a valid device.
            unsafe { result::device::get_attribute(device, which) }
                .map_err(|e| call_failed("cuDeviceGetAttribute", e))
        };
        Ok((
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// The device's UUID, which names the same GPU in every process whatever
    /// `CUDA_VISIBLE_DEVICES` each was given.
    pub fn uuid(&self) -> Result<[u8; 16], Unavailable> {
        let device =
            result::device::get(self.ordinal as i32).map_err(|e| call_failed("cuDeviceGet", e))?;
        let uuid =
            result::device::get_uuid(device).map_err(|e| call_failed("cuDeviceGetUuid", e))?;
        Ok(uuid.bytes.map(|b| b as u8))
    }

    /// The device's primary context (retained for the process's life).
    pub(crate) fn context(&self) -> sys::CUcontext {
        self.context
    }

    /// Runs `f` with this device's context current on the calling thread, then restores what
    /// was current before (a framework's thread keeps its own context).
    pub(crate) fn in_context<T>(
        &self,
        call: &'static str,
        f: impl FnOnce() -> Result<T, DriverError>,
    ) -> Result<T, Unavailable> {
        in_context(self.context, f).map_err(|e| call_failed(call, e))
    }

    /// Page-locks `len` bytes at `start` for every context (`CU_MEMHOSTREGISTER_PORTABLE`):
    /// the driver then copies from them by DMA, and torch reports them pinned. Plain cached
    /// memory stays plain cached memory (not write-combined): CPU threads write it and users
    /// read it.
    ///
    /// # Safety
    /// The range is mapped, stays mapped until [`Cuda::unlock_pages`] is called on `start`,
    /// and is not registered already.
    pub unsafe fn lock_pages(&self, start: *mut u8, len: usize) -> Result<(), Unavailable> {
        self.in_context("cuMemHostRegister", || {
            // SAFETY: as the caller promises.
            unsafe {
                sys::cuMemHostRegister_v2(
                    start.cast::<c_void>(),
                    len,
                    sys::CU_MEMHOSTREGISTER_PORTABLE,
                )
                .result()
            }
        })
    }

    /// Undoes [`Cuda::lock_pages`].
    ///
    /// # Safety
    /// `start` was locked by [`Cuda::lock_pages`], and no copy reads the range any more.
    pub unsafe fn unlock_pages(&self, start: *mut u8) {
        let unlocked = self.in_context("cuMemHostUnregister", || {
            // SAFETY: as the caller promises.
            unsafe { sys::cuMemHostUnregister(start.cast::<c_void>()).result() }
        });
        if let Err(error) = unlocked {
            tracing::warn!(%error, "could not unlock a batch slot's pages");
        }
    }

    /// Makes `stream` wait (on the GPU) for each of `events` (recorded, or never recorded).
    ///
    /// # Safety
    /// `stream` is a live stream of this device's primary context (or 0); the events are live.
    pub(crate) unsafe fn stream_wait(
        &self,
        stream: usize,
        events: &[sys::CUevent],
    ) -> Result<(), Unavailable> {
        self.in_context("cuStreamWaitEvent", || {
            for &event in events {
                // SAFETY: as the caller promises.
                unsafe { sys::cuStreamWaitEvent(stream as sys::CUstream, event, 0) }.result()?;
            }
            Ok(())
        })
    }

    /// A fence on `stream` (a `CUstream` of this device's primary context, such as
    /// `torch.cuda.Stream.cuda_stream`; 0 is the legacy default stream): done once the work
    /// queued there so far is.
    ///
    /// # Safety
    /// `stream` is a live stream of this device's primary context (or 0).
    pub unsafe fn fence(&self, stream: usize) -> Result<Fence, Unavailable> {
        let event = match self.shared.take() {
            Some(event) => event,
            None => self.in_context("cuEventCreate", new_event)?,
        };
        let recorded = self.in_context("cuEventRecord", || {
            // SAFETY: the event is this context's; the stream is, as the caller promises.
            unsafe { result::event::record(event.0, stream as sys::CUstream) }
        });
        match recorded {
            Ok(()) => Ok(Fence {
                kind: FenceKind::Event(event),
                device: Arc::clone(&self.shared),
            }),
            Err(error) => {
                self.shared.put_back(event);
                Err(error)
            }
        }
    }

    /// A fence on the whole device: done once everything queued there so far is (for a
    /// release whose streams cannot be known; its wait spins, so it is the exception).
    pub fn device_fence(&self) -> Fence {
        Fence {
            kind: FenceKind::Device,
            device: Arc::clone(&self.shared),
        }
    }

    /// Registers streams of this device's primary context that a user's copy may be queued
    /// on, for every later [`Cuda::sweep`] to fence (each once, however often registered).
    ///
    /// # Safety
    /// Each is a stream of this device's primary context that is never destroyed while the
    /// process runs (torch's pool streams are not).
    pub unsafe fn watch_streams(&self, streams: &[usize]) {
        self.shared.watch(streams);
    }

    /// Streams registered by [`Cuda::watch_streams`] so far.
    pub fn watched_streams(&self) -> usize {
        self.shared
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// A sweep of this device for [`Cuda::release_after_sweeps`]: the fence thread fences the
    /// legacy default stream and every watched stream, and waits for them.
    pub fn sweep(&self) -> Sweep {
        Sweep(Arc::clone(&self.shared))
    }

    /// Whether `stream` is one a sweep of this device fences (the legacy default stream or a
    /// watched one): a release need not fence it itself.
    pub fn swept(&self, stream: usize) -> bool {
        self.shared.sweeps(stream)
    }

    /// Drops `keep` once every fence has completed (fences of other devices too), on this
    /// device's fence thread; at once when there are none. The fences' events are reused
    /// afterwards.
    pub fn release_after(self: &Arc<Self>, fences: Vec<Fence>, keep: Box<dyn Send>) {
        self.release_after_sweeps(fences, Vec::new(), keep);
    }

    /// [`Cuda::release_after`], and before `keep` is dropped each device of `sweeps` is swept
    /// on this device's fence thread: fences on all its known streams, recorded then.
    pub fn release_after_sweeps(
        self: &Arc<Self>,
        fences: Vec<Fence>,
        sweeps: Vec<Sweep>,
        keep: Box<dyn Send>,
    ) {
        if fences.is_empty() && sweeps.is_empty() {
            drop(keep);
            return;
        }
        let deferred = Deferred {
            fences,
            sweeps,
            keep,
        };
        if let Err(crossbeam_channel::SendError(deferred)) = self.reclaimer.send(deferred) {
            // The fence thread is gone (process exit): wait here instead.
            deferred.wait_and_drop();
        }
    }

    /// Fences waited for so far, and waits that failed.
    pub fn fence_counts(&self) -> (u64, u64) {
        (
            self.shared.waited.load(Ordering::Relaxed),
            self.shared.failed.load(Ordering::Relaxed),
        )
    }
}

/// Runs `f` with `context` current on the calling thread, then restores what was current
/// before (a framework's thread keeps its own context). A thread that has `context` current
/// already (a lane pipe's, torch's) runs `f` as it is: pushing and popping the same context
/// changes nothing but costs two driver calls each time.
pub(crate) fn in_context<T>(
    context: sys::CUcontext,
    f: impl FnOnce() -> Result<T, DriverError>,
) -> Result<T, DriverError> {
    let mut current = std::ptr::null_mut();
    // SAFETY: reads the calling thread's current context into a local.
    if unsafe { sys::cuCtxGetCurrent(&mut current) }
        .result()
        .is_ok()
        && !context.is_null()
        && current == context
    {
        return f();
    }
    // SAFETY: the contexts given here are primary contexts retained for the process's life.
    unsafe { sys::cuCtxPushCurrent_v2(context) }.result()?;
    let out = f();
    let mut popped = std::ptr::null_mut();
    // SAFETY: pops the context pushed above.
    let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
    out
}

/// A context handle sent to the fence thread.
struct SendContext(sys::CUcontext);
// SAFETY: a context handle may be made current on any thread.
unsafe impl Send for SendContext {}
unsafe impl Sync for SendContext {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_opening_names_it_and_never_panics() {
        if driver_present() {
            // A machine with a driver opens device 0, or says why not (no device).
            match Cuda::open(0) {
                Ok(cuda) => assert_eq!(cuda.ordinal(), 0),
                Err(error) => assert!(!matches!(error, Unavailable::NoDriver), "{error}"),
            }
            return;
        }
        let error = Cuda::open(0).unwrap_err();
        assert_eq!(error, Unavailable::NoDriver);
        assert!(error.to_string().contains("libcuda.so.1"), "{error}");
        // Asking again gives the same answer, not a panic from a half-loaded library.
        assert_eq!(Cuda::open(3).unwrap_err(), Unavailable::NoDriver);
    }

    #[test]
    fn a_following_pool_locks_through_the_device_the_process_already_uses() {
        // The thread's current device wins: torch's set_device made it current there.
        assert_eq!(follow_device(Some(3), &[0, 3], 0), 3);
        assert_eq!(follow_device(Some(2), &[], 0), 2);
        // No current context: the device named at construction when it is in use...
        assert_eq!(follow_device(None, &[1, 3], 3), 3);
        // ...else one the process already uses rather than starting another...
        assert_eq!(follow_device(None, &[2, 5], 0), 2);
        // ...and only with none in use the one named at construction.
        assert_eq!(follow_device(None, &[], 4), 4);
    }

    #[test]
    fn checking_a_device_names_what_is_missing() {
        if driver_present() {
            // A context is current on a thread only where something made it so: not here.
            if let Err(error) = check_device(0) {
                assert!(!matches!(error, Unavailable::NoDriver), "{error}");
            }
            assert_eq!(current_device(), None);
            return;
        }
        assert_eq!(check_device(0), Err(Unavailable::NoDriver));
        assert_eq!(current_device(), None);
    }

    #[test]
    fn messages_name_the_missing_piece() {
        let none = Unavailable::NoDevice {
            ordinal: 2,
            count: 1,
        };
        assert_eq!(none.to_string(), "no CUDA device 2: the driver sees 1");
        let call = Unavailable::Call {
            call: "cuMemHostRegister",
            error: "CUDA_ERROR_INVALID_VALUE: invalid argument".into(),
        };
        assert!(call.to_string().contains("cuMemHostRegister failed"));
    }
}
