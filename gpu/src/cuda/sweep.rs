//! The fence thread, and its sweeps. The thread waits for the fences of each deferred reference
//! ([`super::Cuda::release_after`]) and only then drops it. Sweeps: before the slot of a batch
//! handed to the user is reused, the device's fence thread fences every stream a copy from it
//! may have been queued on (the legacy default stream and every stream registered with
//! [`super::Cuda::watch_streams`], torch's pool) and waits for them all. A fence recorded after
//! the release covers every copy queued before it.
//!
//! CUDA graph capture is the hazard: torch captures in the global mode by default, under which
//! another thread's "unsafe" calls fail and invalidate the capture, and an event recorded on a
//! capturing stream becomes part of the graph instead of a fence. The fence thread runs in the
//! relaxed mode (so its calls are allowed), asks each stream whether it is capturing before
//! recording on it, waits a capture out (the work queued before the capture began is still in
//! the stream's queue then), and records again when its record fell into a capture begun
//! between the question and the record (the wait then says `CUDA_ERROR_CAPTURED_EVENT`).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use cudarc::driver::{result, sys, DriverError};

use super::{describe, in_context, Event, Fence, FenceState};

/// What the reclaimer thread waits for and then drops.
pub(super) struct Deferred {
    pub(super) fences: Vec<Fence>,
    pub(super) sweeps: Vec<Sweep>,
    pub(super) keep: Box<dyn Send>,
}

impl Deferred {
    /// Waits for each fence (each on its own device), then drops what was kept.
    pub(super) fn wait_and_drop(self) {
        Deferred::wait_and_drop_all(vec![self]);
    }

    /// Waits for the fences of every item, sweeps each device any of them asks for once (a
    /// sweep after all their releases covers the copies queued before each), then drops what
    /// they kept.
    fn wait_and_drop_all(items: Vec<Deferred>) {
        let mut devices: Vec<Arc<FenceState>> = Vec::new();
        let mut keeps = Vec::with_capacity(items.len());
        for item in items {
            for fence in &item.fences {
                fence.device.wait(fence.kind);
            }
            for device in item.sweeps {
                if !devices.iter().any(|d| Arc::ptr_eq(d, &device.0)) {
                    devices.push(device.0);
                }
            }
            keeps.push(item.keep);
        }
        for device in devices {
            device.sweep();
        }
        drop(keeps);
    }
}

/// A fence's event in the current context: blocking sync (the fence thread sleeps while it
/// waits instead of spinning a core the decode threads need), no timing (cheaper to record).
pub(super) fn new_event() -> Result<Event, DriverError> {
    let mut event = std::ptr::null_mut();
    // SAFETY: a plain event creation into a local.
    unsafe {
        sys::cuEventCreate(
            &mut event,
            sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
                | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
        .result()?;
    }
    Ok(Event(event))
}

/// Deferred references the fence thread takes together, at most: one sweep covers them all.
const TAKEN_TOGETHER: usize = 64;

/// The fence thread: waits for the deferred references' fences in arrival order, sweeps the
/// devices they ask for, then drops them; what arrived while it was busy is taken together.
/// Fences of one stream complete in order, so waiting in order costs nothing extra. The
/// `Cuda` lives in a process-wide map and is never dropped, so this runs until the process
/// ends.
pub(super) fn reclaim(shared: Arc<FenceState>, deferred: Receiver<Deferred>) {
    // SAFETY: the context is retained for the process's life; this thread is ours.
    if let Err(error) = unsafe { result::ctx::set_current(shared.context.0) } {
        tracing::warn!(error = %describe(error), "the fence thread cannot use the device");
    }
    // Relaxed: another thread's CUDA graph capture (torch's is global by default) neither
    // forbids this thread's queries and waits nor is broken by them.
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: sets this thread's own mode, writing the old one into a local.
    if let Err(error) = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) }.result() {
        tracing::warn!(error = %describe(error), "the fence thread keeps the global capture mode");
    }
    while let Ok(first) = deferred.recv() {
        let mut items = vec![first];
        while items.len() < TAKEN_TOGETHER {
            match deferred.try_recv() {
                Ok(item) => items.push(item),
                Err(_) => break,
            }
        }
        Deferred::wait_and_drop_all(items);
    }
}

/// A device whose streams the fence thread sweeps before a release's reference is dropped
/// ([`super::Cuda::sweep`]).
pub struct Sweep(pub(super) Arc<FenceState>);

impl fmt::Debug for Sweep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Sweep").field(&self.0.ordinal).finish()
    }
}

impl FenceState {
    /// Adds streams to those every sweep fences.
    pub(super) fn watch(&self, streams: &[usize]) {
        let mut watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
        let all: BTreeSet<usize> = watched.iter().chain(streams).copied().collect();
        *watched = all.into_iter().collect();
    }

    /// The streams a sweep fences, sorted: the legacy default stream (0) and every watched one.
    pub(super) fn swept_streams(&self) -> Vec<usize> {
        let watched = self.watched.lock().unwrap_or_else(|p| p.into_inner());
        let mut streams = Vec::with_capacity(watched.len() + 1);
        streams.push(0);
        streams.extend(watched.iter().copied().filter(|&s| s != 0));
        streams
    }

    /// Whether a sweep fences `stream`, read in place (asked at every release of a batch).
    pub(super) fn sweeps(&self, stream: usize) -> bool {
        stream == 0
            || self
                .watched
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .binary_search(&stream)
                .is_ok()
    }

    /// Fences every swept stream of this device and waits for them all, counting each wait.
    pub(super) fn sweep(&self) {
        let streams = self.swept_streams();
        let swept = in_context(self.context.0, || {
            Ok(sweep_streams(&Streams(self), &streams, CAPTURE_PATIENCE))
        });
        match swept {
            Ok(waits) => {
                for waited in waits {
                    self.count(waited);
                }
            }
            Err(error) => self.count(Err(error)),
        }
    }
}

/// After this long waiting for a capture to end, the fence thread says so (and goes on
/// waiting: a slot is never refilled under a copy).
const CAPTURE_PATIENCE: Duration = Duration::from_secs(10);

/// How often a stream under capture is asked again whether its capture has ended.
const CAPTURE_POLL: Duration = Duration::from_millis(1);

/// Times a fence is recorded again when its record fell into a capture begun between the
/// check and the record (each time after that capture has ended).
const CAPTURED_RETRIES: usize = 16;

/// What a sweep does with one device's streams, as a seam: the order of the calls (a capture
/// waited out, a fence recorded, waited, recorded again when it fell into a capture) is tested
/// without a GPU. The device's context is current on the calling thread.
trait SweptDevice {
    /// A recorded point on a stream.
    type Mark;
    /// Whether a capture is under way on `stream`.
    fn capturing(&self, stream: usize) -> Result<bool, DriverError>;
    /// A point on `stream` after the work queued there so far.
    fn record(&self, stream: usize) -> Result<Self::Mark, DriverError>;
    /// Waits until the point has passed.
    fn wait(&self, mark: &Self::Mark) -> Result<(), DriverError>;
}

/// Fences each of `streams` and waits for every fence; one result per stream. A stream under
/// capture is fenced once the capture ends (a warning after `patience`); a fence whose record
/// fell into a capture that began after the check is recorded again after it.
fn sweep_streams<D: SweptDevice>(
    device: &D,
    streams: &[usize],
    patience: Duration,
) -> Vec<Result<(), DriverError>> {
    let marks: Vec<(usize, Result<D::Mark, DriverError>)> = streams
        .iter()
        .map(|&stream| (stream, record_outside_capture(device, stream, patience)))
        .collect();
    marks
        .into_iter()
        .map(|(stream, mark)| {
            let mut waited = mark.and_then(|mark| device.wait(&mark));
            let mut retries = 0;
            while is_captured_event(&waited) && retries < CAPTURED_RETRIES {
                retries += 1;
                waited = record_outside_capture(device, stream, patience)
                    .and_then(|mark| device.wait(&mark));
            }
            waited
        })
        .collect()
}

fn is_captured_event(waited: &Result<(), DriverError>) -> bool {
    matches!(
        waited,
        Err(DriverError(sys::CUresult::CUDA_ERROR_CAPTURED_EVENT))
    )
}

/// Records a point on `stream` once no capture is under way on it (the legacy default stream
/// reads as captured while a blocking stream of the context is).
fn record_outside_capture<D: SweptDevice>(
    device: &D,
    stream: usize,
    patience: Duration,
) -> Result<D::Mark, DriverError> {
    let started = Instant::now();
    let mut warned = false;
    loop {
        match device.capturing(stream) {
            Ok(false) => return device.record(stream),
            Ok(true) | Err(DriverError(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)) => {
                if !warned && started.elapsed() >= patience {
                    warned = true;
                    tracing::warn!(
                        stream,
                        waited_s = started.elapsed().as_secs_f64(),
                        "a batch slot waits for a CUDA graph capture on a stream that may copy from it to end"
                    );
                }
                std::thread::sleep(CAPTURE_POLL);
            }
            Err(error) => return Err(error),
        }
    }
}

/// A device's streams as the sweep sees them (its context current on the calling thread).
struct Streams<'a>(&'a FenceState);

impl SweptDevice for Streams<'_> {
    type Mark = Event;

    fn capturing(&self, stream: usize) -> Result<bool, DriverError> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: swept streams live as long as the process (see `Cuda::watch_streams`); the
        // query writes a local.
        unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) }.result()?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    fn record(&self, stream: usize) -> Result<Event, DriverError> {
        let event = match self.0.take() {
            Some(event) => event,
            None => new_event()?,
        };
        // SAFETY: the event is of the current context, the stream lives (as above).
        match unsafe { result::event::record(event.0, stream as sys::CUstream) } {
            Ok(()) => Ok(event),
            Err(error) => {
                self.0.put_back(event);
                Err(error)
            }
        }
    }

    fn wait(&self, event: &Event) -> Result<(), DriverError> {
        // SAFETY: the event was recorded on a stream of the current context.
        let waited = unsafe { result::event::synchronize(event.0) };
        self.0.put_back(*event);
        waited
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;

    use super::super::SendContext;
    use super::*;

    /// A device whose streams are ids, with a script of captures: what the sweep asked, in
    /// order.
    struct Scripted {
        /// For each stream, how many more `capturing` queries answer "under capture".
        capturing: Mutex<HashMap<usize, usize>>,
        /// Streams whose next wait answers that the record fell into a capture.
        captured_once: Mutex<Vec<usize>>,
        /// Streams whose record fails for good.
        broken: Vec<usize>,
        calls: Mutex<Vec<String>>,
    }

    impl Scripted {
        fn new(capturing: &[(usize, usize)], captured_once: &[usize], broken: &[usize]) -> Self {
            Self {
                capturing: Mutex::new(capturing.iter().copied().collect()),
                captured_once: Mutex::new(captured_once.to_vec()),
                broken: broken.to_vec(),
                calls: Mutex::new(Vec::new()),
            }
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl SweptDevice for Scripted {
        type Mark = usize;

        fn capturing(&self, stream: usize) -> Result<bool, DriverError> {
            let mut left = self.capturing.lock().unwrap();
            let under = left.get_mut(&stream).is_some_and(|n| {
                let under = *n > 0;
                *n = n.saturating_sub(1);
                under
            });
            if under && stream == 0 {
                // The legacy stream while a blocking stream captures.
                return Err(DriverError(
                    sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                ));
            }
            Ok(under)
        }

        fn record(&self, stream: usize) -> Result<usize, DriverError> {
            self.calls.lock().unwrap().push(format!("record {stream}"));
            if self.broken.contains(&stream) {
                return Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_HANDLE));
            }
            Ok(stream)
        }

        fn wait(&self, mark: &usize) -> Result<(), DriverError> {
            self.calls.lock().unwrap().push(format!("wait {mark}"));
            let mut once = self.captured_once.lock().unwrap();
            if let Some(at) = once.iter().position(|s| s == mark) {
                once.remove(at);
                return Err(DriverError(sys::CUresult::CUDA_ERROR_CAPTURED_EVENT));
            }
            Ok(())
        }
    }

    #[test]
    fn a_sweep_fences_the_legacy_stream_and_each_watched_stream_once() {
        let state = FenceState {
            ordinal: 0,
            context: SendContext(std::ptr::null_mut()),
            free_events: Mutex::new(Vec::new()),
            watched: Mutex::new(Vec::new()),
            waited: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        };
        assert_eq!(state.swept_streams(), [0]);
        // Two loaders register the same pool, one with the legacy stream among it.
        state.watch(&[0x30, 0x10, 0x20]);
        state.watch(&[0x20, 0, 0x40]);
        assert_eq!(state.swept_streams(), [0, 0x10, 0x20, 0x30, 0x40]);
        assert!(state.sweeps(0) && state.sweeps(0x20) && !state.sweeps(0x50));
    }

    #[test]
    fn a_sweep_records_on_every_stream_before_it_waits_for_any() {
        let device = Scripted::new(&[], &[], &[]);
        let waits = sweep_streams(&device, &[0, 7, 9], Duration::from_secs(10));
        assert!(waits.iter().all(Result::is_ok), "{waits:?}");
        assert_eq!(
            device.calls(),
            ["record 0", "record 7", "record 9", "wait 0", "wait 7", "wait 9"]
        );
    }

    #[test]
    fn a_stream_under_capture_is_fenced_once_its_capture_has_ended() {
        // Stream 7 answers "capturing" three times, the legacy stream (a blocking stream of
        // the context capturing) twice: both are recorded only after, none is skipped.
        let device = Scripted::new(&[(7, 3), (0, 2)], &[], &[]);
        let waits = sweep_streams(&device, &[0, 7], Duration::ZERO);
        assert!(waits.iter().all(Result::is_ok), "{waits:?}");
        assert_eq!(device.calls(), ["record 0", "record 7", "wait 0", "wait 7"]);
        assert!(device.capturing.lock().unwrap().values().all(|&n| n == 0));
    }

    #[test]
    fn a_record_that_fell_into_a_capture_is_made_again_after_it() {
        // Stream 5's capture began between the check and the record: its wait says so, and
        // the fence is recorded and waited for again.
        let device = Scripted::new(&[], &[5], &[]);
        let waits = sweep_streams(&device, &[5, 6], Duration::from_secs(10));
        assert!(waits.iter().all(Result::is_ok), "{waits:?}");
        assert_eq!(
            device.calls(),
            ["record 5", "record 6", "wait 5", "record 5", "wait 5", "wait 6"]
        );
    }

    #[test]
    fn a_stream_that_cannot_be_fenced_is_a_failed_wait_and_the_others_are_still_waited() {
        let device = Scripted::new(&[], &[], &[3]);
        let waits = sweep_streams(&device, &[3, 4], Duration::from_secs(10));
        assert_eq!(
            waits,
            [
                Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_HANDLE)),
                Ok(())
            ]
        );
        assert_eq!(device.calls(), ["record 3", "record 4", "wait 4"]);
    }
}
